"""VllmEngine: vLLM's ``AsyncLLM`` behind the EngineAdapter protocol.

vLLM does the engine's work: its EngineCore (scheduler, KV cache, prefix cache, model) runs in its own process
and talks to ``AsyncLLM`` over ZMQ; ``AsyncLLM`` lives in the server's event loop. This adapter maps our
contract onto it and keeps the state vLLM does not own (weight version, what Sleep released). Semantics follow
the embedded engine:

- Generate: ``TokensPrompt`` in, token deltas with logprobs out (``sampling.py``, ``outputs.py``); closing the
  stream (client gone) closes vLLM's generator, which aborts the request inside the engine.
- Pause uses vLLM's own modes (``pause_generation(mode=abort|keep|wait)``); while paused vLLM queues new
  requests, so they wait, they are not refused. Pause never clears the cache (``clear_cache=False``).
- Sleep: vLLM's CPU worker cannot release memory (it logs "sleep mode is not supported on CPU" and frees
  nothing), so on CPU Sleep only changes the state (Generate is refused, health says NOT_SERVING), returns
  ``memory_released = False`` and GetServerInfo says ``sleep_releases_memory = False``. Where vLLM's platform
  has sleep mode (GPU), Sleep and WakeUp are vLLM's (vLLM's level 1 offloads the weights too).
- UpdateWeights: tensors validated against the checkpoint here (``weights.py``), loaded into the model in the
  engine process through ``collective_rpc`` (``worker.py``), then the prefix cache is reset (KV computed with
  the old weights must not be reused) and the version is set, in vLLM too.
- GetLoad: requests in the engine from vLLM's output processor, split into running and waiting with vLLM's
  scheduler stats (``stats.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

import vllm
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.platforms import current_platform
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from agentloop_grpc.common.tokenizer_fingerprint import tokenizer_fingerprint

from agentloop_grpc.common import model_store
from agentloop_grpc.common.model_store import eos_token_ids
from agentloop_grpc.common.errors import (
    DuplicateRequestError,
    EngineOverloadedError,
    EngineUnavailableError,
    FailedPreconditionError,
    InvalidRequestError,
)
from agentloop_grpc.common.types import (
    EngineState,
    GenerateComplete,
    GenerateEvent,
    GenerateRequest,
    LoadInfo,
    NamedTensor,
    PauseMode,
    PauseResult,
    Resource,
    ServerInfo,
    WeightUpdateResult,
)
from ..validation import MAX_TOP_LOGPROBS, check_prompt, check_sampling, quote
from . import outputs, sampling, weights
from .config import VllmEngineConfig
from .stats import SchedulerLoad, recorder_factory

log = logging.getLogger(__name__)

_WORKER_EXTENSION = "agentloop_grpc.engine_adapters.vllm.worker.AgentloopWorkerExtension"
_PAUSE_MODES = {PauseMode.ABORT: "abort", PauseMode.KEEP: "keep", PauseMode.WAIT: "wait"}
_WAKE_TAGS = {Resource.WEIGHTS: "weights", Resource.KV_CACHE: "kv_cache"}


@dataclass(frozen=True, slots=True)
class _Loaded:
    """What start() built; None before."""

    llm: AsyncLLM
    model_id: str
    fingerprint: str
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    checkpoint: weights.CheckpointWeights
    packed_modules: dict[str, list[str]]


def apply_engine_environment(config: VllmEngineConfig) -> None:
    """Set what vLLM reads from the environment when it starts its engine process (it has no arguments for
    these). Defaults give way to what the environment already says; ``config.cpu_cores`` is explicit and wins.

    The engine process is spawned, not forked: this process runs gRPC's threads, which a fork would copy in an
    unknown state. Models are local folders, so nothing may reach a model hub.
    """
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if config.cpu_cores is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu_cores
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"


def engine_args(config: VllmEngineConfig, folder: Path, model_id: str) -> AsyncEngineArgs:
    return AsyncEngineArgs(
        model=str(folder),
        tokenizer=str(folder),
        served_model_name=model_id,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        kv_cache_memory_bytes=config.kv_cache_bytes,
        max_num_seqs=config.max_running,
        enforce_eager=config.enforce_eager,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",  # logprobs under the distribution sampled from (as embedded)
        max_logprobs=MAX_TOP_LOGPROBS,
        scheduling_policy="priority",  # GenerateRequest.priority is honoured (sampling.priority flips the sign)
        worker_extension_cls=_WORKER_EXTENSION,
        enable_sleep_mode=current_platform.is_sleep_mode_available(),
        disable_log_stats=True,  # our recorder still gets the scheduler stats; vLLM's periodic log stays off
        seed=0,
    )


class VllmEngine:
    """The vLLM EngineAdapter (see module docstring)."""

    def __init__(self, config: VllmEngineConfig | None = None) -> None:
        self.config = config or VllmEngineConfig()
        self._loaded: _Loaded | None = None
        self._scheduler = SchedulerLoad()
        self._weight_version = 0
        self._released: set[Resource] = set()
        self._paused = False
        self._pausing = False  # a PAUSE_MODE_WAIT in progress: new requests already wait
        self._streams: set[str] = set()  # request ids of our open Generate streams
        self._control = asyncio.Lock()  # pause, resume, weights, flush and sleep one at a time
        self._sleep_frees_memory = current_platform.is_sleep_mode_available()

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        folder = await asyncio.to_thread(model_store.resolve, cfg.model, cfg.cache_dir)
        tokenizer = await asyncio.to_thread(model_store.load_tokenizer, folder)
        model_id = model_store.DEFAULT_MODEL_ID if cfg.model is None else folder.name
        apply_engine_environment(cfg)
        args = engine_args(cfg, folder, model_id)
        # AsyncLLM's constructor blocks until the engine process is up: build it on a thread
        # so the server answers health checks (NOT_SERVING) meanwhile; its asyncio parts start on first use.
        llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args, stat_loggers=[recorder_factory(self._scheduler)])
        await llm.is_paused()  # starts the client's output task on this loop (engine failures reach us early)
        tied = bool(getattr(llm.model_config.hf_config, "tie_word_embeddings", False))
        (packed, *_) = await llm.collective_rpc("agentloop_packed_modules")
        generation_eos = llm.model_config.try_get_generation_config().get("eos_token_id")
        self._loaded = _Loaded(
            llm=llm,
            model_id=model_id,
            fingerprint=tokenizer_fingerprint(tokenizer),
            vocab_size=llm.model_config.get_vocab_size(),
            max_model_len=llm.model_config.max_model_len,
            eos_token_ids=tuple(sorted(eos_token_ids(tokenizer.eos_token_id, generation_eos))),
            checkpoint=weights.CheckpointWeights(folder, cfg.dtype, tied),
            packed_modules=packed,
        )
        log.info("vLLM %s engine: %s from %s (max_model_len %d)", vllm.__version__, model_id, folder, cfg.max_model_len)

    async def shutdown(self) -> None:
        loaded = self._loaded
        if loaded is None:
            return
        await self.abort(None)
        loaded.llm.shutdown()
        # Drop AsyncLLM now: left to interpreter exit, its __del__ shuts down again with half-torn-down modules.
        self._loaded = None

    def _state(self) -> EngineState:
        if self._loaded is None:
            return EngineState.LOADING
        if self._released:
            return EngineState.SLEEPING
        return EngineState.PAUSED if self._paused or self._pausing else EngineState.RUNNING

    def info(self) -> ServerInfo:
        loaded = self._loaded
        return ServerInfo(
            engine_kind="vllm",
            engine_version=vllm.__version__,
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
            sleep_releases_memory=self._sleep_frees_memory,
            supports_structured_output=True,
        )

    def _in_engine(self) -> int:
        """Requests vLLM has not finished (its output processor's count: a final output not yet read by our
        stream no longer counts)."""
        return self._loaded.llm.get_num_unfinished_requests() if self._loaded else 0

    def load(self) -> LoadInfo:
        total = self._in_engine()
        running = min(self._scheduler.running, total)
        return LoadInfo(
            running_requests=running,
            waiting_requests=total - running,
            kv_cache_usage=min(max(self._scheduler.kv_cache_usage, 0.0), 1.0),
            prefix_cache_hit_rate=self._scheduler.prefix_cache_hit_rate,
            max_running_requests=self.config.max_running,
        )

    # -- generation ------------------------------------------------------------------------------------------

    def _serving(self) -> _Loaded:
        loaded = self._loaded
        if loaded is None or self._released:
            raise EngineUnavailableError("the vLLM engine is " + ("loading" if loaded is None else "asleep"))
        return loaded

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateEvent]:
        loaded = self._serving()
        if request.request_id in self._streams:
            raise DuplicateRequestError(f"request_id {quote(request.request_id)} is already in flight on this engine")
        info = self.info()  # the servicer validated already; direct (in-process) callers are checked here too
        check_prompt(request.prompt_ids, info)
        check_sampling(request.sampling, info)
        if self._in_engine() >= self.config.max_running + self.config.max_waiting:
            raise EngineOverloadedError(f"the waiting queue is full ({self.config.max_waiting} requests)")
        params = sampling.to_vllm(request)
        self._streams.add(request.request_id)
        emitted, last_token = 0, None
        try:
            stream = loaded.llm.generate(
                TokensPrompt(prompt_token_ids=list(request.prompt_ids)),
                params,
                request.request_id,
                priority=sampling.priority(request),
            )
            async with contextlib.aclosing(_translated_errors(stream)) as stream_outputs:
                async for output in stream_outputs:
                    completion = output.outputs[0]
                    chunk = outputs.token_chunk(completion, request.sampling, self._weight_version)
                    if chunk is not None:
                        emitted += len(chunk.token_ids)
                        last_token = chunk.token_ids[-1]
                        yield chunk
                    if output.finished:
                        yield self._complete(request, output, emitted, last_token)
                        return
            raise RuntimeError(f"vLLM ended request {request.request_id!r} without a finished output")
        finally:
            self._streams.discard(request.request_id)

    def _complete(self, request: GenerateRequest, output, emitted: int, last_token: int | None) -> GenerateComplete:
        completion = output.outputs[0]
        return outputs.completion(
            completion,
            outputs.finish_reason(completion),
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=emitted,
            cached_prompt_tokens=output.num_cached_tokens or 0,
            last_token=last_token,
            weight_version=self._weight_version,
        )

    async def abort(self, request_ids: Seq[str] | None) -> list[str]:
        wanted = sorted(self._streams) if request_ids is None else [r for r in request_ids if r in self._streams]
        if wanted and self._loaded is not None:
            await self._loaded.llm.abort(wanted)  # each stream then ends with its final ABORT output
        return wanted

    # -- control ---------------------------------------------------------------------------------------------

    async def sleep(self, level: int) -> bool:
        loaded = self._loaded
        async with self._control:
            if self._in_engine():
                raise FailedPreconditionError(f"{self._in_engine()} requests are in flight")
            if self._sleep_frees_memory:
                await loaded.llm.sleep(level)
            self._released |= {Resource.KV_CACHE} if level == 1 else {Resource.KV_CACHE, Resource.WEIGHTS}
        return self._sleep_frees_memory

    async def wake_up(self, resources: frozenset[Resource]) -> EngineState:
        async with self._control:
            restore = frozenset(resources) & self._released
            if restore and self._sleep_frees_memory:
                await self._loaded.llm.wake_up(tags=sorted(_WAKE_TAGS[r] for r in restore))
            self._released -= restore
        return self._state()

    async def pause(self, mode: PauseMode) -> PauseResult:
        llm = self._serving().llm
        async with self._control:
            in_flight = self._in_engine()
            if mode is PauseMode.WAIT:
                self._pausing = True
            try:
                await llm.pause_generation(mode=_PAUSE_MODES[mode], clear_cache=False)
            except asyncio.CancelledError:
                await llm.resume_generation()
                raise
            finally:
                self._pausing = False
            self._paused = True
        if mode is PauseMode.ABORT:
            return PauseResult(aborted_requests=in_flight)
        return PauseResult(kept_requests=in_flight if mode is PauseMode.KEEP else 0)

    async def resume(self) -> None:
        async with self._control:
            if self._paused and self._loaded is not None:
                await self._loaded.llm.resume_generation()
            self._paused = False

    async def update_weights(
        self, tensors: Seq[NamedTensor], weight_version: int, flush_cache: bool
    ) -> WeightUpdateResult:
        if Resource.WEIGHTS in self._released:
            raise EngineUnavailableError("the weights are released (asleep); WakeUp with WAKE_UP_TAG_WEIGHTS first")
        loaded = self._loaded
        if loaded is None:
            raise EngineUnavailableError("the vLLM engine is loading")
        staged = loaded.checkpoint.stage(tensors)
        async with self._control:
            payload = await asyncio.to_thread(loaded.checkpoint.complete, staged, loaded.packed_modules)
            await loaded.llm.collective_rpc("agentloop_load_weights", args=(payload,))
            loaded.checkpoint.commit(payload, loaded.packed_modules)
            # KV computed with the old weights must not be reused, whatever flush_cache says.
            await self._reset_prefix_cache(loaded.llm)
            await loaded.llm.update_weight_version(str(weight_version))
            self._weight_version = weight_version
        return WeightUpdateResult(weight_version=weight_version, tensors_updated=len(tensors))

    async def flush_cache(self) -> None:
        async with self._control:
            await self._reset_prefix_cache(self._serving().llm)

    @staticmethod
    async def _reset_prefix_cache(llm: AsyncLLM) -> None:
        """Drop vLLM's prefix cache; running requests are preempted and recompute their KV when next scheduled
        (vLLM refuses the reset while running requests hold cached blocks otherwise)."""
        if not await llm.reset_prefix_cache(reset_running_requests=True):
            raise FailedPreconditionError("vLLM could not reset its prefix cache (requests are transferring KV)")


async def _translated_errors(stream: AsyncIterator) -> AsyncIterator:
    """vLLM's generate stream with its errors turned into ours: a request vLLM rejects is INVALID_ARGUMENT, a dead
    engine is UNAVAILABLE; anything else stays an engine error (INTERNAL). Closing it closes vLLM's stream,
    which aborts the request inside the engine."""
    try:
        async for output in stream:
            yield output
    except VLLMClientError as error:
        raise InvalidRequestError(f"vLLM rejected the request: {error}") from error
    except EngineGenerateError as error:
        if isinstance(error.__cause__, (ValueError, TypeError)):
            raise InvalidRequestError(f"vLLM rejected the request: {error.__cause__}") from error
        raise
    except EngineDeadError as error:
        raise EngineUnavailableError("the vLLM engine process died; retry on another server") from error
    finally:
        await stream.aclose()
