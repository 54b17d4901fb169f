"""EmbeddedEngine: the default engine (transformers on CPU) behind the EngineAdapter protocol.

The async front (this module) owns requests' streams and the engine's state (paused, released resources,
weight version); the scheduler core (``scheduler.py``) owns the model, the KV slots and the prefix cache and runs
one step at a time on a single worker thread, so the event loop stays responsive while the model computes.
Every torch operation (loading, steps, weight updates, sleep and wake, even creating a request's sampler) runs
on that one thread, under ``_step_lock``: a control call waits for the current step to end and no step starts
until it is done. One thread is also a performance rule: torch's OpenMP pool is per calling thread, and as soon
as a second thread runs parallel torch ops the two pools throttle each other and every step slows (NOTES.md).

Semantics follow the fake engine: while paused new requests are held (not refused); ABORT aborts in-flight
requests, KEEP holds them mid-stream, WAIT returns once they finished; Sleep needs nothing in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator
from collections.abc import Sequence as Seq
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from agentloop_grpc import __version__
from agentloop_grpc.common.tokenizer_fingerprint import tokenizer_fingerprint

from agentloop_grpc.common.errors import DuplicateRequestError, EngineOverloadedError, EngineUnavailableError, FailedPreconditionError
from agentloop_grpc.common.types import (
    EngineState,
    FinishReason,
    GenerateComplete,
    GenerateEvent,
    GenerateRequest,
    LoadInfo,
    NamedTensor,
    PauseMode,
    PauseResult,
    Resource,
    ServerInfo,
    TokenChunk,
    WeightUpdateResult,
)
from ..validation import check_prompt, check_sampling, quote
from agentloop_grpc.common import model_store
from agentloop_grpc.common.model_store import eos_token_ids

from . import memory, weight_update
from .config import EmbeddedEngineConfig
from .prefix_cache import PrefixCache
from .runner import ModelRunner
from .scheduler import Emission, Scheduler
from .sequence import Sequence
from .streaming import stream
from .structured import GrammarCompiler

if TYPE_CHECKING:
    import xgrammar as xgr

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Loaded:
    """What start() built; None before."""

    model: torch.nn.Module
    runner: ModelRunner
    scheduler: Scheduler
    grammars: GrammarCompiler
    offload: weight_update.WeightOffload
    model_id: str
    fingerprint: str
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]


class EmbeddedEngine:
    """The embedded EngineAdapter (see module docstring)."""

    def __init__(self, config: EmbeddedEngineConfig | None = None) -> None:
        self.config = config or EmbeddedEngineConfig()
        self._loaded: _Loaded | None = None
        self._prefix_cache = PrefixCache(self.config.prefix_block_size, self.config.prefix_cache_tokens)
        self._weight_version = 0
        self._released: set[Resource] = set()
        self._paused = False
        self._hold_new = False  # new requests wait in _held (paused, or a PAUSE_MODE_WAIT in progress)
        self._live: dict[str, Sequence] = {}
        # requests whose constraint compiles (in flight, not yet in _live), each with a future Abort sets
        self._compiling: dict[str, asyncio.Future[None]] = {}
        self._held: list[Sequence] = []
        self._arrivals = itertools.count()
        self._work = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._step_lock = asyncio.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedded-engine")
        self._loop_task: asyncio.Task | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loaded = await self._on_worker(self._load)
        await self._loaded.grammars.start()
        self._loop_task = asyncio.create_task(self._run(), name="embedded-engine-scheduler")

    def _load(self) -> _Loaded:
        cfg = self.config
        torch.set_num_threads(cfg.threads)
        folder = model_store.resolve(cfg.model, cfg.cache_dir)
        model, tokenizer = model_store.load(folder)
        max_len = min(cfg.max_model_len, getattr(model.config, "max_position_embeddings", cfg.max_model_len))
        runner = ModelRunner(model, cfg.max_running, max_len)
        runner.kv.allocate()
        eos = eos_token_ids(tokenizer.eos_token_id, model.generation_config.eos_token_id)
        vocab = model.config.vocab_size
        scheduler = Scheduler(runner, self._prefix_cache, eos, cfg.max_running, max_len, cfg.prefill_chunk, vocab)
        grammars = GrammarCompiler(tokenizer, vocab, cfg)
        offload = weight_update.WeightOffload(model, (cfg.cache_dir or model_store.cache_root()) / "offload")
        model_id = model_store.DEFAULT_MODEL_ID if cfg.model is None else folder.name
        log.info("embedded engine: %s from %s, %d slots x %d tokens", model_id, folder, cfg.max_running, max_len)
        return _Loaded(
            model,
            runner,
            scheduler,
            grammars,
            offload,
            model_id,
            tokenizer_fingerprint(tokenizer),
            vocab,
            max_len,
            tuple(sorted(eos)),
        )

    async def shutdown(self) -> None:
        await self.abort(None)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        self._executor.shutdown(wait=True)
        if self._loaded is not None:
            await self._loaded.grammars.close()

    async def _on_worker(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def _state(self) -> EngineState:
        if self._loaded is None:
            return EngineState.LOADING
        if self._released:
            return EngineState.SLEEPING
        return EngineState.PAUSED if self._paused or self._hold_new else EngineState.RUNNING

    def info(self) -> ServerInfo:
        loaded = self._loaded
        return ServerInfo(
            engine_kind="embedded",
            engine_version=__version__,
            model_id=loaded.model_id if loaded else "",
            tokenizer_fingerprint=loaded.fingerprint if loaded else "",
            vocab_size=loaded.vocab_size if loaded else 0,
            max_model_len=loaded.max_model_len if loaded else self.config.max_model_len,
            eos_token_ids=loaded.eos_token_ids if loaded else (),
            weight_version=self._weight_version,
            state=self._state(),
            dp_rank=self.config.dp_rank,
            dp_size=self.config.dp_size,
            tp_size=1,
            sleep_releases_memory=True,
            supports_structured_output=True,
        )

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

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateEvent]:
        loaded = self._loaded
        if loaded is None or self._released:
            raise EngineUnavailableError("the embedded engine is " + ("loading" if loaded is None else "asleep"))
        if request.request_id in self._live or request.request_id in self._compiling:
            raise DuplicateRequestError(f"request_id {quote(request.request_id)} is already in flight on this engine")
        # The servicer validated already; checking again keeps direct (in-process) callers from feeding the core
        # a request that would fail a whole batch step.
        info = self.info()
        check_prompt(request.prompt_ids, info)
        check_sampling(request.sampling, info)
        grammar = None
        if request.structured_output is not None:
            grammar = await self._compile(request)
            if grammar is None:  # aborted while compiling
                yield self._aborted_before_start(request)
                return
            if self._released:  # put to sleep while compiling
                raise EngineUnavailableError("the embedded engine is asleep")
        if len(self._live) - self._running_count() >= self.config.max_waiting:
            raise EngineOverloadedError(f"the waiting queue is full ({self.config.max_waiting} requests)")
        sequence = Sequence(request, grammar, next(self._arrivals), list(request.prompt_ids))
        self._live[request.request_id] = sequence
        if self._hold_new or self._paused:
            self._held.append(sequence)
        else:
            self._submit(sequence)
        try:
            async for event in stream(sequence.events):
                yield event
        finally:
            if not sequence.closed:
                self._close(sequence, FinishReason.ABORT)

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
            weight_version=self._weight_version,
            cached_prompt_tokens=0,
        )

    def _submit(self, sequence: Sequence) -> None:
        self._loaded.scheduler.submit(sequence)
        self._idle.clear()
        self._work.set()

    def _close(self, sequence: Sequence, reason: FinishReason, matched: int | None = None) -> None:
        """Queue the completion (once); an aborted request is released by the core at its next step."""
        if sequence.closed:
            return
        sequence.closed = True
        if reason is FinishReason.ABORT:
            sequence.aborted = True
            self._work.set()
        self._live.pop(sequence.request_id, None)
        if sequence in self._held:
            self._held.remove(sequence)
        sequence.events.put_nowait(
            GenerateComplete(
                finish_reason=reason,
                prompt_tokens=sequence.prompt_len,
                completion_tokens=sequence.emitted,
                weight_version=self._weight_version,
                cached_prompt_tokens=sequence.cached,
                matched_stop_token_id=matched,
            )
        )
        if len(self._live) == len(self._held):
            self._idle.set()

    async def abort(self, request_ids: Seq[str] | None) -> list[str]:
        wanted = None if request_ids is None else set(request_ids)
        aborted = []
        for sequence in list(self._live.values()):
            if wanted is None or sequence.request_id in wanted:
                self._close(sequence, FinishReason.ABORT)
                aborted.append(sequence.request_id)
        for request_id, compile_aborted in self._compiling.items():
            if (wanted is None or request_id in wanted) and not compile_aborted.done():
                compile_aborted.set_result(None)
                aborted.append(request_id)
        return aborted

    # -- the scheduling loop ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        scheduler = self._loaded.scheduler
        while True:
            if self._paused or self._released or not scheduler.has_work():
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
        """Fail every request the core had (held ones never reached it and go on waiting)."""
        for sequence in [s for s in self._live.values() if s not in self._held]:
            sequence.closed = sequence.aborted = True
            del self._live[sequence.request_id]
            sequence.events.put_nowait(RuntimeError(f"the embedded engine failed this request: {error!r}"))
        self._idle.set()

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
                    weight_version=self._weight_version,
                    logprobs=(sampled.logprob,) if want_logprobs else (),
                    top_logprobs=(sampled.top,) if params.top_logprobs else (),
                )
            )
            if emission.finish is not None:
                self._close(sequence, emission.finish, emission.matched_stop)

    # -- control ---------------------------------------------------------------------------------------------

    async def sleep(self, level: int) -> bool:
        if self._live:
            raise FailedPreconditionError(f"{len(self._live)} requests are in flight")
        loaded = self._loaded
        async with self._step_lock:
            await self._on_worker(self._release, loaded, level)
        await loaded.grammars.release()
        self._released |= {Resource.KV_CACHE} if level == 1 else {Resource.KV_CACHE, Resource.WEIGHTS}
        return True

    def _release(self, loaded: _Loaded, level: int) -> None:
        loaded.scheduler.clear()
        loaded.runner.kv.release()
        self._prefix_cache.clear()
        if level >= 2:
            loaded.offload.offload()
        memory.trim()

    async def wake_up(self, resources: frozenset[Resource]) -> EngineState:
        restore = frozenset(resources) & self._released
        if restore:
            async with self._step_lock:
                await self._on_worker(self._restore, self._loaded, restore)
            self._released -= restore
            self._work.set()
        return self._state()

    @staticmethod
    def _restore(loaded: _Loaded, resources: frozenset[Resource]) -> None:
        if Resource.WEIGHTS in resources:
            loaded.offload.restore()
        if Resource.KV_CACHE in resources:
            loaded.runner.kv.allocate()

    async def pause(self, mode: PauseMode) -> PauseResult:
        if mode is PauseMode.ABORT:
            self._paused = True
            return PauseResult(aborted_requests=len(await self.abort(None)))
        if mode is PauseMode.KEEP:
            self._paused = True
            return PauseResult(kept_requests=len(self._live) - len(self._held))
        self._hold_new, self._paused = True, False  # WAIT: let what is in flight finish, hold newcomers
        self._work.set()
        try:
            await self._idle.wait()
        except asyncio.CancelledError:
            await self.resume()
            raise
        self._paused = True
        return PauseResult()

    async def resume(self) -> None:
        self._paused = self._hold_new = False
        held, self._held = self._held, []
        for sequence in held:
            self._submit(sequence)
        self._work.set()

    async def update_weights(
        self, tensors: Seq[NamedTensor], weight_version: int, flush_cache: bool
    ) -> WeightUpdateResult:
        if Resource.WEIGHTS in self._released:
            raise EngineUnavailableError("the weights are released (asleep); WakeUp with WAKE_UP_TAG_WEIGHTS first")
        loaded = self._loaded
        async with self._step_lock:
            await self._on_worker(self._apply_weights, loaded, tensors)
            self._weight_version = weight_version
        return WeightUpdateResult(weight_version=weight_version, tensors_updated=len(tensors))

    def _apply_weights(self, loaded: _Loaded, tensors: Seq[NamedTensor]) -> None:
        weight_update.apply(weight_update.stage(loaded.model, tensors))
        self._prefix_cache.clear()  # KV computed with the old weights must not be reused, whatever flush_cache says

    async def flush_cache(self) -> None:
        async with self._step_lock:
            self._prefix_cache.clear()
