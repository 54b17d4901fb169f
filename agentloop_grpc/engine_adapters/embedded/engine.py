"""EmbeddedEngine: the default engine (transformers on CPU, or one GPU) behind the EngineAdapter protocol.

The async front (this module) owns requests' streams and what Pause(KEEP), Sleep and weight updates do to the engine
(the state itself is the lifecycle's, ``lifecycle.py``); the scheduler core (``scheduler.py``) owns the model, the KV
slots and the prefix cache and runs one step at a time on a single worker thread, so the event loop stays responsive
while the model computes. Every torch operation (loading, steps, weight updates, sleep and wake, even creating a
request's sampler) runs on that one thread, under ``_step_lock``: a control call waits for the current step to end
and no step starts until it is done. One thread is also a performance rule: torch's OpenMP pool is per calling
thread, and as soon as a second thread runs parallel torch ops the two pools throttle each other and every step slows
(NOTES.md).

Prefix cache (``prefix_cache.py``): EndSessions moves an ended session's blocks to the evict-first end; a weight
update without flush_cache leaves the old weights' blocks to be evicted first and never serves them. GetLoad's
``preemptions`` stays 0: the scheduler never preempts (``scheduler.py``).

Freezing (Pause(KEEP)) stops the scheduling loop between steps: the requests keep their KV and continue
token-exactly when thawed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, Callable
from collections.abc import Sequence as Seq
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, TypeVarTuple

import torch

from agentloop_grpc import __version__
from agentloop_grpc.common import model_store
from agentloop_grpc.common.errors import EngineError, EngineOverloadedError
from agentloop_grpc.common.media import ImageExpander
from agentloop_grpc.common.model_store import eos_token_ids
from agentloop_grpc.common.tokenizer_fingerprint import tokenizer_fingerprint
from agentloop_grpc.common.types import (
    FinishReason,
    GenerateComplete,
    GenerateEvent,
    GenerateRequest,
    LoadInfo,
    NamedTensor,
    Resource,
    ServerFacts,
    TokenChunk,
)
from agentloop_grpc.common.weight_layout import BucketLayout, WeightGroupSpec

from .. import validation
from ..checkpoint import read_checkpoint
from ..weight_groups import LocalWeightGroups
from . import memory, weight_update
from .config import EmbeddedEngineConfig
from .device import placement
from .images import ImageReader, PromptImages
from .prefix_cache import PrefixCache
from .runner import ModelRunner
from .scheduler import Emission, Scheduler
from .sequence import Sequence
from .streaming import stream
from .structured import GrammarCompiler

if TYPE_CHECKING:
    import xgrammar as xgr

log = logging.getLogger(__name__)

# what _on_worker runs: a function and its arguments, typed as the function takes them
Args = TypeVarTuple("Args")
Result = TypeVar("Result")


@dataclass(frozen=True, slots=True)
class _Loaded:
    """What start() built; None before."""

    model: torch.nn.Module
    runner: ModelRunner
    scheduler: Scheduler
    grammars: GrammarCompiler
    offload: weight_update.WeightOffload
    facts: ServerFacts
    images: ImageReader | None  # None: the model takes no images


class EmbeddedEngine:
    """The embedded EngineAdapter (see module docstring)."""

    def __init__(self, config: EmbeddedEngineConfig | None = None) -> None:
        self.config = config or EmbeddedEngineConfig()
        self._loaded: _Loaded | None = None
        self._prefix_cache = PrefixCache(self.config.prefix_block_size, self.config.prefix_cache_tokens)
        self._groups = LocalWeightGroups()
        self._weight_version: Callable[[], int] = lambda: 0
        self._frozen = False
        self._live: dict[str, Sequence] = {}
        # requests whose constraint compiles (in flight, not yet in _live), each with a future Abort sets
        self._compiling: dict[str, asyncio.Future[None]] = {}
        self._arrivals = itertools.count()
        self._work = asyncio.Event()
        self._step_lock = asyncio.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedded-engine")
        self._loop_task: asyncio.Task | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self, weight_version: Callable[[], int]) -> ServerFacts:
        self._weight_version = weight_version
        self._loaded = await self._on_worker(self._load)
        self._loop_task = asyncio.create_task(self._run(), name="embedded-engine-scheduler")
        return self._loaded.facts

    def _load(self) -> _Loaded:
        cfg = self.config
        device = placement(cfg.device)  # before the model loads: a missing GPU is said at once
        torch.set_num_threads(cfg.threads)
        folder = model_store.resolve(cfg.model, cfg.cache_dir)
        model, tokenizer = model_store.load(folder)
        model.to(device)
        text_config = model.config.get_text_config()
        max_len = cfg.max_model_len
        trained = getattr(text_config, "max_position_embeddings", None)
        if trained is not None and max_len > trained:  # served as asked: a coding CLI's 20k-token prompt runs
            log.warning("embedded engine: max_model_len %d is beyond the %d positions %s was trained on: past them "
                        "its outputs degrade", max_len, trained, cfg.model or model_store.DEFAULT_MODEL_ID)
        runner = ModelRunner(model, cfg.max_running, max_len, device)
        runner.kv.allocate()
        eos = eos_token_ids(tokenizer.eos_token_id, model.generation_config.eos_token_id)
        vocab = text_config.vocab_size
        expander = ImageExpander.load(str(folder)) if model_store.has_vision(model.config) else None
        if model_store.has_vision(model.config) and expander is None:
            raise ValueError(f"{folder} holds a vision-language model but no processor that takes images")
        images = ImageReader(expander) if expander is not None else None
        scheduler = Scheduler(runner, self._prefix_cache, eos, cfg.max_running, max_len, cfg.prefill_chunk, vocab)
        grammars = GrammarCompiler(tokenizer, vocab, cfg)
        offload = weight_update.WeightOffload(model, (cfg.cache_dir or model_store.cache_root()) / "offload", device)
        model_id = model_store.DEFAULT_MODEL_ID if cfg.model is None else folder.name
        log.info("embedded engine: %s from %s on %s, %d slots x %d tokens", model_id, folder, device,
                 cfg.max_running, max_len)
        facts = ServerFacts(
            engine_kind="embedded",
            engine_version=__version__,
            model_id=model_id,
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
            vocab_size=vocab,
            max_model_len=max_len,
            eos_token_ids=tuple(sorted(eos)),
            dp_rank=cfg.dp_rank,
            dp_size=cfg.dp_size,
            sleep_releases_memory=True,
            supports_structured_output=True,
            weight_group_ranks=1,
            default_max_new_tokens=cfg.default_max_new_tokens,
            supports_images=images is not None,
            max_images_per_request=cfg.max_images_per_request if images is not None else 0,
            routed_expert_layers=runner.moe_layers,
            routed_experts_per_token=runner.experts_per_token,
            num_experts=runner.num_experts,
        )
        return _Loaded(model, runner, scheduler, grammars, offload, facts, images)

    async def shutdown(self) -> None:
        await self.abort(list(self._live) + list(self._compiling))
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        self._executor.shutdown(wait=True)
        if self._loaded is not None:
            await self._loaded.grammars.close()

    async def _on_worker(self, function: Callable[[*Args], Result], *args: *Args) -> Result:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    @property
    def prefix_cache(self) -> PrefixCache:
        """The prefix cache (read-only use: tests and benchmarks look at what it holds)."""
        return self._prefix_cache

    def _running_count(self) -> int:
        return sum(1 for s in self._live.values() if s.slot >= 0)

    def load(self) -> LoadInfo:
        running = self._running_count()
        loaded = self._loaded
        return LoadInfo(
            running_requests=running,
            waiting_requests=len(self._live) - running + len(self._compiling),
            kv_cache_usage=loaded.scheduler.kv_usage if loaded and loaded.runner.kv.allocated else 0.0,
            prefix_cache_hit_rate=self._prefix_cache.hit_rate,
            max_running_requests=self.config.max_running,
        )

    # -- generation ------------------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateEvent, None]:
        # The request is valid (convert.py checks it against the catalogue); only what the model alone knows, its
        # images' expansion, is checked here.
        images = await self._read_images(request)
        grammar = None
        if request.structured_output is not None:
            grammar = await self._compile(request)
            if grammar is None:  # aborted while compiling
                yield self._aborted_before_start(request)
                return
        if len(self._live) - self._running_count() >= self.config.max_waiting:
            raise EngineOverloadedError(f"the waiting queue is full ({self.config.max_waiting} requests)")
        sequence = Sequence(request, grammar, next(self._arrivals), list(request.prompt_ids), images)
        self._live[request.request_id] = sequence
        self._loaded.scheduler.submit(sequence)
        self._work.set()
        try:
            async for event in stream(sequence.events):
                yield event
        finally:
            if not sequence.closed:
                self._close(sequence, FinishReason.ABORT)

    async def _read_images(self, request: GenerateRequest) -> PromptImages | None:
        """The request's images checked against the model's expansion (InvalidRequestError before admission);
        None without images."""
        reader = self._loaded.images
        if reader is None:
            if request.media:
                raise validation.media_unsupported()
            return None
        if not request.media:
            reader.read(request)  # only checks that no image token stands outside a span: no decoding
            return None
        return await asyncio.to_thread(reader.read, request)  # decoding and resizing: PIL and numpy, no torch

    async def _compile(self, request: GenerateRequest) -> xgr.CompiledGrammar | None:
        """The request's compiled constraint; None if Abort came first. Whichever way the request ends first
        (Abort, cancellation), its compilation is stopped."""
        aborted = self._compiling[request.request_id] = asyncio.get_running_loop().create_future()
        compiling = asyncio.ensure_future(self._loaded.grammars.compile(request.structured_output))
        try:
            await asyncio.wait((compiling, aborted), return_when=asyncio.FIRST_COMPLETED)
        finally:
            del self._compiling[request.request_id]
            compiling.cancel()  # nothing once compiled; else no request waits for it and its process is killed
        return None if aborted.done() else compiling.result()

    def _aborted_before_start(self, request: GenerateRequest) -> GenerateComplete:
        return GenerateComplete(
            finish_reason=FinishReason.ABORT,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=0,
            weight_version=self._weight_version(),
            cached_prompt_tokens=0,
            prompt_images=len(request.media),
        )

    def _close(self, sequence: Sequence, reason: FinishReason, matched: int | None = None) -> None:
        """Queue the completion (once); an aborted request is released by the core at its next step."""
        if sequence.closed:
            return
        sequence.closed = True
        if reason is FinishReason.ABORT:
            sequence.aborted = True
            self._work.set()
        self._live.pop(sequence.request_id, None)
        sequence.events.put_nowait(
            GenerateComplete(
                finish_reason=reason,
                prompt_tokens=sequence.prompt_len,
                completion_tokens=sequence.emitted,
                weight_version=self._weight_version(),
                cached_prompt_tokens=sequence.cached,
                matched_stop_token_id=matched,
                prompt_images=len(sequence.request.media),
                prompt_routed_experts=sequence.prompt_routed_experts,
            )
        )

    async def abort(self, request_ids: Seq[str]) -> None:
        for request_id in request_ids:
            sequence = self._live.get(request_id)
            if sequence is not None:
                self._close(sequence, FinishReason.ABORT)
            compile_aborted = self._compiling.get(request_id)
            if compile_aborted is not None and not compile_aborted.done():
                compile_aborted.set_result(None)

    # -- the scheduling loop ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        scheduler = self._loaded.scheduler
        while True:
            if self._frozen or not scheduler.has_work():
                self._work.clear()
                await self._work.wait()
                continue
            async with self._step_lock:
                try:
                    emissions = await self._on_worker(scheduler.step)
                except Exception as error:  # an engine bug: fail what is in flight, keep serving new requests
                    log.exception("embedded engine step failed; failing %d requests", len(self._live))
                    await self._on_worker(scheduler.clear)
                    self._fail_all(error)
                    continue
            self._emit(emissions)

    def _fail_all(self, error: Exception) -> None:
        """Fail every request the core had."""
        failed, self._live = self._live, {}
        for sequence in failed.values():
            sequence.closed = sequence.aborted = True
            sequence.events.put_nowait(RuntimeError(f"the embedded engine failed this request: {error!r}"))

    def _emit(self, emissions: list[Emission]) -> None:
        for emission in emissions:
            sequence = emission.sequence
            if sequence.closed:
                continue
            sampled = emission.sampled
            params = sequence.request.sampling
            want_logprobs = params.logprobs or params.top_logprobs > 0
            sequence.emitted += 1
            sequence.events.put_nowait(
                TokenChunk(
                    token_ids=(sampled.token,),
                    weight_version=self._weight_version(),
                    logprobs=(sampled.logprob,) if want_logprobs else (),
                    top_logprobs=(sampled.top,) if params.top_logprobs else (),
                    routed_experts=emission.routed_experts,
                )
            )
            if emission.finish is not None:
                self._close(sequence, emission.finish, emission.matched_stop)

    # -- control ---------------------------------------------------------------------------------------------

    async def release(self, resources: frozenset[Resource]) -> None:
        loaded = self._loaded
        async with self._step_lock:
            await self._on_worker(self._release, loaded, resources)
        await loaded.grammars.release()

    def _release(self, loaded: _Loaded, resources: frozenset[Resource]) -> None:
        if Resource.KV_CACHE in resources:
            loaded.scheduler.clear()
            loaded.runner.kv.release()
            self._prefix_cache.clear()
        if Resource.WEIGHTS in resources:
            loaded.offload.offload()
        memory.trim()

    async def restore(self, resources: frozenset[Resource]) -> None:
        async with self._step_lock:
            await self._on_worker(self._restore, self._loaded, resources)
        self._work.set()

    @staticmethod
    def _restore(loaded: _Loaded, resources: frozenset[Resource]) -> None:
        if Resource.WEIGHTS in resources:
            loaded.offload.restore()
        if Resource.KV_CACHE in resources:
            loaded.runner.kv.allocate()

    async def freeze(self) -> None:
        self._frozen = True  # the loop stops before its next step (a step under way ends first)

    async def thaw(self) -> None:
        self._frozen = False
        self._work.set()

    async def update_weights(self, tensors: Seq[NamedTensor], weight_version: int, flush_cache: bool) -> None:
        # checked and decoded off the step lock, while generation goes on: steps wait only for the swap
        staged = await asyncio.to_thread(weight_update.stage, self._loaded.model, tensors)
        async with self._step_lock:
            await self._on_worker(self._apply_weights, staged, flush_cache)

    async def join_weight_group(self, group: WeightGroupSpec) -> list[int]:
        return await self._groups.join(group)

    async def receive_weights(
        self, group: str, layout: BucketLayout, weight_version: int, flush_cache: bool, refusal: EngineError | None
    ) -> None:
        model = self._loaded.model
        # received off the step lock, while generation goes on (the bytes land in one buffer, read as views)
        flat = await self._groups.receive(group, layout, refusal or weight_update.refusal(model, layout.specs))
        staged = weight_update.stage_views(model, layout.views(flat))
        async with self._step_lock:
            await self._on_worker(self._apply_weights, staged, flush_cache)

    async def leave_weight_group(self, group: str) -> None:
        await self._groups.leave(group)

    def _apply_weights(self, staged: list[tuple[torch.nn.Parameter, torch.Tensor]], flush_cache: bool) -> None:
        weight_update.apply(staged)
        # KV computed with the old weights is never reused: flushed, or kept as stale blocks that go first
        if flush_cache:
            self._prefix_cache.clear()
        else:
            self._prefix_cache.advance()

    async def load_weights(self, path: str, weight_version: int, flush_cache: bool) -> tuple[int, int]:
        tensors, read = await asyncio.to_thread(read_checkpoint, path)
        await self.update_weights(tensors, weight_version, flush_cache)
        return len(tensors), read

    async def flush_cache(self) -> None:
        async with self._step_lock:
            self._prefix_cache.clear()

    async def end_sessions(self, session_ids: Seq[str]) -> int:
        async with self._step_lock:  # the core touches the cache only inside a step
            return self._prefix_cache.end_sessions(session_ids)
