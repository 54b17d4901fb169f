"""VllmEngine: vLLM's ``AsyncLLM`` behind the EngineAdapter protocol.

vLLM does the engine's work: its EngineCore (scheduler, KV cache, prefix cache, model) runs in its own process
and talks to ``AsyncLLM`` over ZMQ; ``AsyncLLM`` lives in the server's event loop. This adapter maps our
contract onto it (the state, Pause's gate and the weight version are the lifecycle's, ``lifecycle.py``):

- Generate: ``TokensPrompt`` in, token deltas with logprobs out (``sampling.py``, ``outputs.py``); closing the
  stream (client gone) closes vLLM's generator, which aborts the request inside the engine. A prompt's images
  become vLLM's multi-modal data, each span collapsed to the one placeholder id vLLM expands again; the prompt
  vLLM reports must equal the request's (``images.py``).
- Pause(KEEP) is vLLM's ``pause_generation(mode="keep")``, which never clears the cache here
  (``clear_cache=False``); the other modes need nothing of vLLM (the lifecycle aborts or waits).
- Sleep: vLLM's CPU worker cannot release memory (it logs "sleep mode is not supported on CPU" and frees
  nothing), so on CPU Sleep only changes the state (Generate is refused, health says NOT_SERVING), returns
  ``memory_released = False`` and GetServerInfo says ``sleep_releases_memory = False``. Where vLLM's platform
  has sleep mode (GPU), Sleep and WakeUp are vLLM's (vLLM's level 1 offloads the weights too).
- Weights, three ways in (``weights.py`` checks them against the served checkpoint first, so a bad update
  changes nothing; ``worker.py`` stages them in the engine process, then swaps them in):
  UpdateWeights ships the streamed tensors to the engine process; LoadWeights has the engine process read the
  checkpoint itself (memory-mapped; the server reads only its headers); JoinWeightGroup / ReceiveWeights /
  LeaveWeightGroup put each vLLM worker in the trainer's weight group (rank ``rank_offset`` + its rank) and
  receive the broadcast on a thread of the worker while vLLM keeps generating, the adapter polling it. The swap
  is one step boundary: generation paused (KEEP), the staged tensors reloaded into the model, the prefix cache
  reset where needed (below), vLLM's weight version set, generation resumed.
- Prefix cache and weights: every request carries a ``cache_salt`` naming the weight version it was submitted
  under (``block_hash.version_salt``); vLLM mixes a request's salt into its first block's hash (``vllm/v1/core/
  kv_cache_utils.py``, ``_gen_extra_keys``), so a request of one version never hits a block another version
  computed. An update without flush_cache therefore leaves the old blocks in place, unreachable, and vLLM's LRU
  free queue reuses them first (nothing touches them again). The one case that still needs a reset: requests
  submitted under an older version are in the engine (a salt cannot change once submitted, and one still waiting
  would read the old blocks with the new weights), so the swap resets then, as it does on flush_cache, preempting
  the running ones (they recompute their KV with the new weights; GetLoad counts them in ``preemptions``).
- EndSessions answers 0: vLLM 0.32 has no call that reorders its free-block queue by request or session
  (``session_id`` only labels KV events; ``kv_hints`` reach only the KV-offloading connectors), and a request's
  blocks are freed tail first to the LRU end when it finishes, where they age as every block does.
- Weight versions per token: vLLM labels every engine step's output with its weight version and records the
  spans per request; each TokenChunk carries the version vLLM recorded for its tokens (a delta that spans a
  swap becomes two chunks), so no token is mislabelled by an update that lands while its chunk is in flight.
- GetLoad: requests in the engine from vLLM's output processor, split into running and waiting with vLLM's
  scheduler stats, and the requests vLLM preempted since start (``stats.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from collections.abc import Sequence as Seq
from dataclasses import astuple, dataclass, replace
from multiprocessing.process import BaseProcess
from pathlib import Path

import vllm
from transformers import PreTrainedTokenizerBase
from vllm import SamplingParams as VllmSamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.platforms import current_platform
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from agentloop_grpc.common import model_store
from agentloop_grpc.common.errors import (
    EngineError,
    EngineOverloadedError,
    EngineUnavailableError,
    FailedPreconditionError,
    InvalidRequestError,
)
from agentloop_grpc.common.media import ImageExpander
from agentloop_grpc.common.model_store import eos_token_ids
from agentloop_grpc.common.tokenizer_fingerprint import tokenizer_fingerprint
from agentloop_grpc.common.types import (
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
from ..block_hash import version_salt
from ..image_placeholders import check_no_stray_image_token
from ..validation import MAX_TOP_LOGPROBS
from ..weight_groups import refused_elsewhere
from . import images, outputs, routing, sampling, weights
from .config import VllmEngineConfig
from .stats import SchedulerLoad, recorder_factory

log = logging.getLogger(__name__)

_WORKER_EXTENSION = "agentloop_grpc.engine_adapters.vllm.worker.AgentloopWorkerExtension"
_WAKE_TAGS = {Resource.WEIGHTS: "weights", Resource.KV_CACHE: "kv_cache"}
_POLL_S = 0.015  # between polls of a worker's background weight job: one cheap utility call each
#: How long vLLM lets its engine process exit after SIGTERM before it sends SIGKILL (vLLM's own default).
_ENGINE_EXIT_GRACE_S = 5.0
#: How long to wait for an engine process vLLM has already sent SIGKILL (a killed process exits at once).
_KILLED_EXIT_S = 30.0


@dataclass(frozen=True, slots=True)
class _Loaded:
    """What start() built; None before."""

    llm: AsyncLLM
    facts: ServerFacts
    checkpoint: weights.CheckpointWeights
    image_token_id: int | None  # the id vLLM expands into an image's placeholder ids; None: no images served
    layout: routing.RoutingLayout | None  # None: started without routed experts (requests asking are refused)


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
        limit_mm_per_prompt={"image": config.max_images_per_request},  # ignored for a text-only model
        enable_return_routed_experts=config.return_routed_experts,
    )


class VllmEngine:
    """The vLLM EngineAdapter (see module docstring)."""

    def __init__(self, config: VllmEngineConfig | None = None) -> None:
        self.config = config or VllmEngineConfig()
        self._loaded: _Loaded | None = None
        self._scheduler = SchedulerLoad()
        self._weight_version: Callable[[], int] = lambda: 0
        self._control = asyncio.Lock()  # freeze, thaw, weights, flush and sleep one at a time
        self._frozen = False  # Pause(KEEP) holds vLLM paused: a weight swap must not resume it
        self._updates = itertools.count()
        self._sleep_frees_memory = current_platform.is_sleep_mode_available()
        #: The version new requests are salted with (set at each swap, before generation resumes)
        self._cache_version = 0
        #: Requests in flight per salt version: a swap resets the cache while any of an older version remain
        self._salted: Counter[int] = Counter()

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self, weight_version: Callable[[], int]) -> ServerFacts:
        self._weight_version = weight_version
        self._cache_version = weight_version()
        cfg = self.config
        folder = await asyncio.to_thread(model_store.resolve, cfg.model, cfg.cache_dir)
        tokenizer = await asyncio.to_thread(model_store.load_tokenizer, folder)
        model_id = model_store.DEFAULT_MODEL_ID if cfg.model is None else folder.name
        apply_engine_environment(cfg)
        args = engine_args(cfg, folder, model_id)
        # AsyncLLM's constructor blocks until the engine process is up: build it on a thread
        # so the server answers health checks (NOT_SERVING) meanwhile; its asyncio parts start on first use.
        building = asyncio.ensure_future(
            asyncio.to_thread(AsyncLLM.from_engine_args, args, stat_loggers=[recorder_factory(self._scheduler)])
        )
        try:
            llm = await asyncio.shield(building)
        except asyncio.CancelledError:
            # The build cannot be interrupted: wait for it, so the engine process it starts is stopped, not orphaned.
            with contextlib.suppress(Exception):
                await _close(await building)
            raise
        try:
            self._loaded = await self._facts_of(llm, folder, tokenizer, model_id)
        except BaseException:
            await _close(llm)  # an engine process left running would outlive this failed start
            raise
        log.info("vLLM %s engine: %s from %s (max_model_len %d)", vllm.__version__, model_id, folder, cfg.max_model_len)
        return self._loaded.facts

    async def _facts_of(
        self, llm: AsyncLLM, folder: Path, tokenizer: PreTrainedTokenizerBase, model_id: str
    ) -> _Loaded:
        """What the started engine serves, asked of vLLM (the first calls reach its engine process)."""
        cfg, weight_version = self.config, self._weight_version
        await llm.is_paused()  # starts the client's output task on this loop (engine failures reach us early)
        await llm.update_weight_version(str(weight_version()))  # vLLM labels tokens "default" until told
        tied = bool(getattr(llm.model_config.hf_config, "tie_word_embeddings", False))
        image_token_id = None
        if llm.model_config.is_multimodal_model and cfg.max_images_per_request > 0:
            expander = await asyncio.to_thread(ImageExpander.load, str(folder))
            image_token_id = None if expander is None else expander.image_token_id
        generation_eos = llm.model_config.try_get_generation_config().get("eos_token_id")
        layout = None
        if cfg.return_routed_experts:  # vLLM refused to start unless the model is MoE
            (moe_layers, *_) = await llm.collective_rpc("agentloop_moe_layers")  # the same in every worker
            layout = routing.RoutingLayout(tuple(moe_layers), llm.model_config.get_num_experts_per_tok(),
                                           llm.model_config.get_num_experts())
        facts = ServerFacts(
            engine_kind="vllm",
            engine_version=vllm.__version__,
            model_id=model_id,
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
            vocab_size=llm.model_config.get_vocab_size(),
            max_model_len=llm.model_config.max_model_len,
            eos_token_ids=tuple(sorted(eos_token_ids(tokenizer.eos_token_id, generation_eos))),
            dp_rank=cfg.dp_rank,
            dp_size=cfg.dp_size,
            sleep_releases_memory=self._sleep_frees_memory,
            supports_structured_output=True,
            weight_group_ranks=llm.vllm_config.parallel_config.world_size,
            default_max_new_tokens=cfg.default_max_new_tokens,
            supports_images=image_token_id is not None,
            max_images_per_request=cfg.max_images_per_request if image_token_id is not None else 0,
            routed_expert_layers=len(layout.moe_layers) if layout else 0,
            routed_experts_per_token=layout.per_token if layout else 0,
            num_experts=layout.num_experts if layout else 0,
        )
        return _Loaded(llm, facts, weights.CheckpointWeights(folder, cfg.dtype, tied), image_token_id, layout)

    async def shutdown(self) -> None:
        loaded = self._loaded
        if loaded is None:
            return
        # Drop AsyncLLM now: left to interpreter exit, its __del__ shuts down again with half-torn-down modules.
        self._loaded = None
        await _close(loaded.llm)

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
            preemptions=self._scheduler.preemptions,
        )

    # -- generation ------------------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateEvent, None]:
        loaded = self._loaded  # the request is valid (convert.py); only what vLLM alone knows is checked here
        if self._in_engine() >= self.config.max_running + self.config.max_waiting:
            raise EngineOverloadedError(f"the waiting queue is full ({self.config.max_waiting} requests)")
        params = sampling.to_vllm(request)
        if loaded.image_token_id is not None:
            check_no_stray_image_token(request.prompt_ids, request.media, loaded.image_token_id)
        version = self._cache_version
        self._salted[version] += 1  # from here on a swap to a newer version resets the cache (module docstring)
        try:
            if not request.media:
                prompt = TokensPrompt(prompt_token_ids=request.prompt_ids.tolist())
            elif loaded.image_token_id is None:
                raise validation.media_unsupported()
            else:  # decoding the pictures takes a while: other requests go on meanwhile
                prompt = await asyncio.to_thread(images.tokens_prompt, request.prompt_ids, request.media,
                                                 loaded.image_token_id)
            prompt["cache_salt"] = version_salt(version)
            stream = self._generate(loaded.llm, request, prompt, params, loaded.layout)
            async with contextlib.aclosing(stream) as events:
                async for event in events:  # closed at once when our caller stops early: vLLM aborts the request
                    yield event
        finally:
            self._salted[version] -= 1
            if not self._salted[version]:
                del self._salted[version]

    async def _generate(self, llm: AsyncLLM, request: GenerateRequest, prompt: TokensPrompt, params: VllmSamplingParams,
                        layout: routing.RoutingLayout | None) -> AsyncGenerator[GenerateEvent, None]:
        """``generate``'s stream once the prompt is built: vLLM's outputs as our chunks, then the completion. A
        request that asked for its routed experts gets them from the finished output only (``routing.py``), so its
        deltas are held and all its chunks, each with its tokens' routing, leave then (as with ``final_only``)."""
        emitted, last_token, last_version = 0, None, None
        unchecked = bool(request.media)
        # the layout of a request that asked for its routing on a MoE model: its deltas are held (docstring)
        routed = layout if request.sampling.return_routed_experts else None
        held: list[CompletionOutput] = []
        prompt_routing = b""
        stream = llm.generate(prompt, params, request.request_id, priority=sampling.priority(request))
        async with contextlib.aclosing(_translated_errors(stream)) as stream_outputs:
            async for output in stream_outputs:
                if unchecked:  # before any token leaves; raising closes the stream, so vLLM aborts the request
                    assert output.prompt_token_ids is not None  # None only for a prompt of embeddings, never ours
                    images.check_expansion(request.prompt_ids, request.media, output.prompt_token_ids)
                    unchecked = False
                completion = output.outputs[0]
                if routed is None:
                    starts = self._version_starts(request.request_id, output) if completion.token_ids else []
                    chunks = outputs.token_chunks(completion, request.sampling, emitted, starts)
                else:
                    held.append(completion)
                    if not output.finished:
                        continue
                    prompt_routing, chunks = self._routed_chunks(request, output, held, routed)
                for chunk in chunks:
                    emitted += len(chunk.token_ids)
                    last_token, last_version = chunk.token_ids[-1], chunk.weight_version
                    yield chunk
                if output.finished:
                    complete = self._complete(request, output, emitted, last_token, last_version)
                    yield replace(complete, prompt_routed_experts=prompt_routing) if prompt_routing else complete
                    return
        raise RuntimeError(f"vLLM ended request {request.request_id!r} without a finished output")

    def _routed_chunks(
        self, request: GenerateRequest, output: RequestOutput, held: list[CompletionOutput],
        layout: routing.RoutingLayout,
    ) -> tuple[bytes, list[TokenChunk]]:
        """The prompt's routing and the chunks of every held delta with their tokens' routing, from the finished
        ``output`` (whose weight-version spans cover every output token)."""
        starts = self._version_starts(request.request_id, output)
        chunks: list[TokenChunk] = []
        for delta in held:
            chunks += outputs.token_chunks(delta, request.sampling, sum(len(c.token_ids) for c in chunks), starts)
        return routing.attach(output.outputs[0].routed_experts, layout, len(request.prompt_ids), chunks)

    def _version_starts(self, request_id: str, output: RequestOutput) -> list[tuple[int, int]]:
        """(first output-token index, weight version) of each version span of the request so far, as vLLM
        recorded them: from the final output, or from vLLM's output processor while the request runs (its state
        outlives every non-final output we read: vLLM drops it only where it emits the final one, into which
        any output not yet read is merged)."""
        if output.finished:
            spans = output.outputs[0].weight_versions or ()
            return [(span.start, int(span.version)) for span in spans]
        processor = self._loaded.llm.output_processor
        internal = processor.external_req_ids.get(request_id)  # vLLM suffixes our id to make its own
        state = processor.request_states.get(internal[-1]) if internal else None
        if state is None:
            raise RuntimeError(f"vLLM holds no state for the running request {request_id!r}")
        return [(start, int(version)) for version, start in state.weight_version_starts]

    def _complete(
        self,
        request: GenerateRequest,
        output: RequestOutput,
        emitted: int,
        last_token: int | None,
        last_version: int | None,
    ) -> GenerateComplete:
        completion = output.outputs[0]
        return outputs.completion(
            completion,
            outputs.finish_reason(completion),
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=emitted,
            cached_prompt_tokens=output.num_cached_tokens or 0,
            last_token=last_token,
            weight_version=self._weight_version() if last_version is None else last_version,
            prompt_images=len(request.media),
        )

    async def abort(self, request_ids: Seq[str]) -> None:
        if self._loaded is not None:
            await self._loaded.llm.abort(list(request_ids))  # each stream then ends with its final ABORT output

    # -- control ---------------------------------------------------------------------------------------------

    async def release(self, resources: frozenset[Resource]) -> None:
        if self._sleep_frees_memory:
            async with self._control:
                await self._loaded.llm.sleep(2 if Resource.WEIGHTS in resources else 1)

    async def restore(self, resources: frozenset[Resource]) -> None:
        if self._sleep_frees_memory:
            async with self._control:
                await self._loaded.llm.wake_up(tags=sorted(_WAKE_TAGS[r] for r in resources))

    async def freeze(self) -> None:
        async with self._control:
            await self._loaded.llm.pause_generation(mode="keep", clear_cache=False)
            self._frozen = True

    async def thaw(self) -> None:
        async with self._control:
            await self._loaded.llm.resume_generation()
            self._frozen = False

    async def update_weights(self, tensors: Seq[NamedTensor], weight_version: int, flush_cache: bool) -> None:
        payload = self._loaded.checkpoint.stage(tensors)
        key = self._update_key("stream")
        await self._loaded.llm.collective_rpc("agentloop_stage_payload", args=(key, payload))
        await self._swap(key, weight_version, flush_cache)

    async def load_weights(self, path: str, weight_version: int, flush_cache: bool) -> tuple[int, int]:
        plan, tensors, read = await asyncio.to_thread(self._loaded.checkpoint.check_checkpoint, path)
        key = self._update_key("path")
        await self._job(key, "agentloop_read_checkpoint", key, plan)  # read by the engine process, off its steps
        await self._swap(key, weight_version, flush_cache)
        return tensors, read

    async def join_weight_group(self, group: WeightGroupSpec) -> list[int]:
        key = f"join/{group.name}"
        ranks = await self._job(key, "agentloop_join_group", key, astuple(group))
        await self._loaded.llm.collective_rpc("agentloop_forget", args=(key,))
        return ranks

    async def receive_weights(
        self, group: str, layout: BucketLayout, weight_version: int, flush_cache: bool, refusal: EngineError | None
    ) -> None:
        specs = [(spec.name, spec.dtype, list(spec.shape)) for spec in layout.specs]
        targets: list[str] = []
        if refusal is None:
            try:
                targets = self._loaded.checkpoint.check(specs)
            except InvalidRequestError as error:
                refusal = error  # voted no: nobody receives, and the group stays in step
        key = self._update_key(f"group/{group}")
        try:
            agreed = await self._job(
                key, "agentloop_receive", key, group, specs, layout.bucket_bytes, targets, refusal is None
            )
        except EngineUnavailableError as error:
            raise EngineUnavailableError(f"{error}; join the group again") from error
        if refusal is not None or not all(agreed):
            await self._loaded.llm.collective_rpc("agentloop_forget", args=(key,))
            raise refusal or refused_elsewhere(group)
        await self._swap(key, weight_version, flush_cache)

    async def leave_weight_group(self, group: str) -> None:
        await self._loaded.llm.collective_rpc("agentloop_leave_group", args=(group,))

    def _update_key(self, transport: str) -> str:
        return f"{transport}/{next(self._updates)}"

    async def _job(self, key: str, method: str, *args: object) -> list[object]:
        """Start ``method``'s background job in every worker and poll until all finished; their results. A failed
        weight group is UNAVAILABLE (its message names the group's address)."""
        llm = self._loaded.llm
        try:
            await llm.collective_rpc(method, args=args)
            while True:
                answers = await llm.collective_rpc("agentloop_poll", args=(key,))
                if all(status != "pending" for status, _ in answers):
                    break
                await asyncio.sleep(_POLL_S)
            for status, value in answers:
                if status == "group_error":
                    raise EngineUnavailableError(str(value))
                if status != "done":
                    raise RuntimeError(f"a vLLM worker failed to {method.removeprefix('agentloop_')}: {value}")
        except BaseException:
            await llm.collective_rpc("agentloop_forget", args=(key,))
            raise
        return [value for _, value in answers]

    async def _swap(self, key: str, weight_version: int, flush_cache: bool) -> None:
        """Swap the update staged under ``key`` in at one step boundary, with vLLM's weight version: tokens of
        every step before carry the old version, of every step after the new one. The prefix cache is reset when
        asked, or when requests salted with an older version are in flight (module docstring)."""
        llm = self._loaded.llm
        try:
            async with self._control:
                pausing = not self._frozen
                if pausing:
                    await llm.pause_generation(mode="keep", clear_cache=False)
                try:
                    await llm.collective_rpc("agentloop_apply", args=(key,))
                    self._cache_version = weight_version  # requests from now on never reach the old blocks
                    if flush_cache or any(version < weight_version for version in self._salted):
                        await self._reset_prefix_cache(llm)
                    # Nor image features (vLLM caches them by picture), once the preemption above left none in use.
                    await llm.reset_encoder_cache()
                    await llm.update_weight_version(str(weight_version))
                finally:
                    if pausing:
                        await llm.resume_generation()
        except BaseException:
            await llm.collective_rpc("agentloop_forget", args=(key,))
            raise

    async def flush_cache(self) -> None:
        async with self._control:
            await self._reset_prefix_cache(self._loaded.llm)

    async def end_sessions(self, session_ids: Seq[str]) -> int:
        """0: vLLM cannot demote a request's blocks (module docstring)."""
        return 0

    @staticmethod
    async def _reset_prefix_cache(llm: AsyncLLM) -> None:
        """Drop vLLM's prefix cache; running requests are preempted and recompute their KV when next scheduled
        (vLLM refuses the reset while running requests hold cached blocks otherwise)."""
        if not await llm.reset_prefix_cache(reset_running_requests=True):
            raise FailedPreconditionError("vLLM could not reset its prefix cache (requests are transferring KV)")


def engine_processes(llm: AsyncLLM) -> list[BaseProcess]:
    """The engine-core processes vLLM started for ``llm`` (none where the engine runs elsewhere)."""
    resources = getattr(llm.engine_core, "resources", None)
    manager = getattr(resources, "engine_manager", None)
    return list(getattr(manager, "processes", ()))


async def _close(llm: AsyncLLM) -> None:
    """Shut vLLM down and wait for every engine process it started."""
    processes = engine_processes(llm)
    llm.shutdown(timeout=_ENGINE_EXIT_GRACE_S)
    await asyncio.to_thread(reap, processes)


def reap(processes: Seq[BaseProcess]) -> None:
    """Wait for each engine process vLLM shut down: vLLM reaps the ones that exit within its grace period but
    only sends SIGKILL to the others and never waits for them, which leaves them zombies of this process."""
    for process in processes:
        process.join(_KILLED_EXIT_S)
        if process.exitcode is None:
            log.warning("vLLM's engine process %s (pid %s) outlived SIGKILL", process.name, process.pid)


async def _translated_errors(
    stream: AsyncGenerator[RequestOutput, None],
) -> AsyncGenerator[RequestOutput, None]:
    """vLLM's generate stream with its errors turned into ours: a request vLLM rejects is INVALID_ARGUMENT, a dead
    engine is UNAVAILABLE; anything else stays an engine error (INTERNAL). Closing it closes vLLM's stream,
    which aborts the request inside the engine."""
    try:
        async for output in stream:
            yield output
    except VLLMClientError as error:
        raise validation.invalid(validation.ENGINE_REJECTED, engine="vLLM", reason=error) from error
    except EngineGenerateError as error:
        if isinstance(error.__cause__, (ValueError, TypeError)):
            raise validation.invalid(validation.ENGINE_REJECTED, engine="vLLM", reason=error.__cause__) from error
        raise
    except EngineDeadError as error:
        raise EngineUnavailableError("the vLLM engine process died; retry on another server") from error
    finally:
        await stream.aclose()
