"""SglangEngineActor: what a user deploys as the named Ray actor on each TP rank of a DP group.

The TP-rank-0 actor holds ``sgl.Engine`` (created lazily by ``start()`` from the engine kwargs, so deploying the
actors is quick and the adapter decides when the model loads); ``sgl.Engine`` itself starts one scheduler process
per TP rank. The other ranks' actors hold no engine: they reserve their rank's place (GPUs, placement) and make
the group's completeness visible to the adapter, which refuses to serve an incomplete group.

Streaming: ``generate`` is an async generator method, called with ``.options(num_returns="streaming")``, which
Ray 2.60 supports for async actors (each yielded item becomes an object ref the caller awaits as soon as it is
produced). It was chosen over a poll-based design because the tokens are pushed as SGLang produces them (no
polling interval added to the latency, no per-request buffers kept in the actor between polls), and because
``ray.cancel`` on the stream raises CancelledError inside the generator, where ``finally`` aborts the request in
SGLang: a client that goes away frees the engine without a second mechanism.

Why the control methods await ``engine.tokenizer_manager`` coroutines: see ``api.py``. Every method is async
and the actor runs on one event loop (Ray async actor), which is also the loop SGLang's TokenizerManager uses.

Weight-transfer groups: this process is the group's member for the whole DP group (``LocalWeightGroups``, one
rank). It receives the broadcast on a thread, so the loop keeps streaming tokens, then hands the tensors to
``update_weights_from_tensor``, which feeds every TP rank (``engine.py`` says why SGLang's own group is not used).
Methods that can be refused return the ``EngineError`` instead of raising it, so the adapter re-raises it with its
own message rather than Ray's wrapped traceback.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agentloop_grpc.common.errors import EngineError, InvalidRequestError
from agentloop_grpc.common.types import GenerateRequest, NamedTensor
from agentloop_grpc.common.weight_layout import BucketLayout, WeightGroupSpec

from ..weight_groups import LocalWeightGroups
from .api import SglangApi
from .config import TpRank
from .facts import EngineFacts, EngineLoad, read_facts, read_load
from .outputs import OutputReader, StreamDelta, expansion_mismatch
from .sampling import generate_kwargs
from .weights import model_folder

log = logging.getLogger(__name__)

#: SGLang's pause mode for Pause(KEEP), the only mode that reaches it (the lifecycle aborts or waits itself).
PAUSE_IN_PLACE = "in_place"


class NotLeaderError(RuntimeError):
    """An engine call reached an actor that holds no engine (TP rank > 0, or not started)."""


def to_torch(tensors: Sequence[NamedTensor]) -> list[tuple[str, Any]]:
    """Our named tensors (row-major bytes) as the (name, torch.Tensor) pairs SGLang loads."""
    import torch

    pairs = []
    for tensor in tensors:
        dtype = getattr(torch, tensor.dtype)
        if tensor.data:
            value = torch.frombuffer(bytearray(tensor.data), dtype=dtype).reshape(tensor.shape)
        else:
            value = torch.empty(tensor.shape, dtype=dtype)
        pairs.append((tensor.name, value))
    return pairs


class SglangEngineActor:
    """One TP rank of an SGLang DP group (see module docstring). Deploy with ``ray.remote`` under
    ``rank.name`` in ``rank.naming.namespace`` (``deploy.deploy_tp_group`` does)."""

    def __init__(self, rank: TpRank, engine_kwargs: dict[str, Any] | None = None, api: SglangApi | None = None) -> None:
        self._rank = rank
        self._engine_kwargs = dict(engine_kwargs or {})
        self._api = api
        self._engine: Any = None
        self._facts: EngineFacts | None = None
        self._groups = LocalWeightGroups()

    async def identity(self) -> TpRank:
        return self._rank

    def _leader(self) -> Any:
        if self._engine is None:
            raise NotLeaderError(
                f"actor {self._rank.name!r} holds no engine (TP rank {self._rank.tp_rank}, or not started)"
            )
        return self._engine

    async def start(self) -> EngineFacts:
        """Create the engine (rank 0 only, once) and return its facts. Blocks this actor's loop while loading."""
        if self._rank.tp_rank != 0:
            raise NotLeaderError(
                f"actor {self._rank.name!r} is TP rank {self._rank.tp_rank}; only rank 0 holds sgl.Engine"
            )
        if self._facts is None:
            api = self._api or SglangApi.load()
            self._api = api
            self._engine = api.engine_class(**self._engine_kwargs)
            self._facts = read_facts(self._engine, api.version, str(self._engine_kwargs.get("model_path", "")))
        return self._facts

    async def generate(self, request: GenerateRequest, cache_salt: str | None = None) -> AsyncIterator[StreamDelta]:
        """Stream one request's deltas; the last carries the end. Closing or cancelling aborts it in SGLang.
        ``cache_salt`` is SGLang's radix-cache namespace of the request (the adapter's weight version)."""
        engine = self._leader()
        routing = self._facts.routing if request.sampling.return_routed_experts else None
        reader = OutputReader(request.sampling.logprobs, request.sampling.top_logprobs, routing)
        outputs = await engine.async_generate(**generate_kwargs(request, self._facts.image_token_id, cache_salt))
        ended = False
        unchecked = bool(request.media)
        try:
            async for output in outputs:
                if unchecked:  # before any token leaves; returning unended aborts the request in SGLang
                    refusal = expansion_mismatch(output["meta_info"], len(request.prompt_ids), len(request.media))
                    if refusal is not None:
                        yield refusal
                        return
                    unchecked = False
                delta = reader.read(output)
                ended = delta.end is not None
                yield delta
                if ended:
                    return
            raise RuntimeError(f"SGLang ended request {request.request_id!r} without a finish reason")
        finally:
            if not ended:
                engine.tokenizer_manager.abort_request(rid=request.request_id)
            with contextlib.suppress(RuntimeError):  # already closed by SGLang
                await outputs.aclose()

    async def pause(self, mode: str) -> None:
        await self._leader().tokenizer_manager.pause_generation(self._api.pause_request(mode=mode))

    async def resume(self) -> None:
        await self._leader().tokenizer_manager.continue_generation(self._api.continue_request())

    async def release_memory(self, tags: list[str]) -> None:
        manager = self._leader().tokenizer_manager
        await manager.release_memory_occupation(self._api.release_memory_request(tags=tags), None)

    async def resume_memory(self, tags: list[str]) -> None:
        manager = self._leader().tokenizer_manager
        await manager.resume_memory_occupation(self._api.resume_memory_request(tags=tags), None)

    async def update_weights(
        self, tensors: list[NamedTensor], flush_cache: bool, weight_version: int
    ) -> tuple[bool, str]:
        """Load ``tensors`` into the model; SGLang's (success, message)."""
        return await self._load_tensors(to_torch(tensors), flush_cache, weight_version)

    async def _load_tensors(
        self, named: list[tuple[str, Any]], flush_cache: bool, weight_version: int
    ) -> tuple[bool, str]:
        payload = [self._api.serialize_tensors(named) for _ in range(self._rank.tp_size)]
        request = self._api.update_weights_request(
            serialized_named_tensors=payload, flush_cache=flush_cache, weight_version=str(weight_version)
        )
        success, message = await self._leader().tokenizer_manager.update_weights_from_tensor(request, None)
        return bool(success), str(message)

    async def load_weights(self, path: str, flush_cache: bool, weight_version: int) -> tuple[int, int] | EngineError:
        """LoadWeights with SGLang's own loader (``update_weights_from_disk``): (tensors, bytes), or the refusal."""
        manager = self._leader().tokenizer_manager
        try:
            with model_folder(path) as (folder, tensors, size):
                request = self._api.update_disk_request(
                    model_path=folder, load_format="safetensors", flush_cache=flush_cache,
                    weight_version=str(weight_version),
                )
                success, message, _paused = await manager.update_weights_from_disk(request, None)
        except InvalidRequestError as error:
            return error
        if not success:
            return InvalidRequestError(f"SGLang refused the checkpoint {path!r}: {message}")
        return tensors, size

    async def join_weight_group(self, group: WeightGroupSpec) -> list[int] | EngineError:
        """Join ``group`` as its one member for this DP group (rank ``group.rank_offset``)."""
        try:
            return await self._groups.join(group)
        except EngineError as error:
            return error

    async def receive_weights(
        self, group: str, layout: BucketLayout, flush_cache: bool, weight_version: int, refusal: EngineError | None
    ) -> EngineError | None:
        """Vote, receive the broadcast off the loop (generation goes on), then load it in one SGLang call."""
        try:
            flat = await self._groups.receive(group, layout, refusal)
        except EngineError as error:
            return error
        named = [(spec.name, view) for spec, view in layout.views(flat)]
        success, message = await self._load_tensors(named, flush_cache, weight_version)
        if not success:  # SGLang judges names and shapes only when loading: the bytes were received, the group stays
            return InvalidRequestError(f"SGLang refused the weight update: {message}")
        return None

    async def leave_weight_group(self, group: str) -> None:
        await self._groups.leave(group)

    async def flush_cache(self) -> bool:
        result = await self._leader().tokenizer_manager.flush_cache()
        return bool(result.success)

    async def load(self) -> EngineLoad:
        return read_load(await self._leader().tokenizer_manager.get_loads())

    async def shutdown(self) -> None:
        """Stop the engine's processes (the actor itself stays until its owner kills it)."""
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
            self._facts = None
