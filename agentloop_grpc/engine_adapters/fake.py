"""FakeEngine: a fake engine (no model) for contract tests and benchmarks of our own overhead.

It is named a fake everywhere it appears. Its tokens are a deterministic function of the prompt ids and the seed
(greedy requests ignore the seed; unseeded sampled requests draw one), so tests can check exact streams. It
behaves like a real engine where the contract cares: a scheduler with a bounded batch (continuous batching: a
request joins between decode steps and leaves when done), a bounded waiting queue, configurable prefill and
per-token latency, a block-hashed prefix cache whose hits shorten prefill (least recently used blocks leave
first, a sequence's tail before its head, as in vLLM), abort and freezing for Pause(KEEP). As in vLLM and SGLang, a
prompt's blocks are reusable as soon as they are prefilled (not only once the request finishes), so requests that
share a system prompt and arrive while the first one still decodes hit it, and of requests prefilled in one step
only the first computes a shared prefix (vLLM v1 caches a request's full blocks when it allocates them; SGLang holds
back a request whose prefix another of the batch computes). EndSessions moves the blocks an ended session left (and no
live session holds) to the evict-first end (``session_blocks.py``). It never preempts (GetLoad's ``preemptions`` is
0). Its tokens do not depend on weights, but its cache is keyed by the weight version a request arrives under, as
the real engines' are: after an update a prompt misses once, and the old version's blocks, never touched again,
leave first.

Images (``GenerateRequest.media``, checked by the servicer against the prompt): the fake has no processor, so it
takes any span; it counts the images (``prompt_images``), keys the blocks their spans overlap by their bytes, and
mixes their bytes into its token stream, so tests see that a picture reached it. A prompt without images gets the
stream it always got.

Routed experts (``return_routed_experts``): configured with ``routed_expert_layers``, it stands in for a MoE model
and reports, per input position, ids hashed from the token there and its position (a real model's routing depends
on the whole prefix), so a later prompt's routing repeats what decoding reported: for overhead benchmarks and Router
tests; unconfigured it refuses the opt-in, as a dense model's engine does.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import random
import zlib
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from agentloop_grpc import __version__
from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.errors import EngineError, EngineOverloadedError, UnsupportedError
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

from .block_hash import BlockChain
from .checkpoint import read_checkpoint
from .fake_config import FakeEngineConfig
from .grouping import merge_chunks
from .session_blocks import SessionBlocks, demote
from .weight_groups import LocalWeightGroups

_MASK64 = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64 finaliser: a cheap, well-spread deterministic hash of an integer."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


class StepClock:
    """Times the fake's decode steps so each takes its configured time on average, however late the event loop
    wakes the scheduler: a step ends at the previous step's planned end plus its duration, so lateness is caught
    up by the next steps (up to ``max_debt_s``; beyond, the debt is dropped rather than bursting steps)."""

    def __init__(self, max_debt_s: float = 0.01) -> None:
        self.max_debt_s = max_debt_s
        self._end: float | None = None

    def reset(self) -> None:
        """The engine idled: the next step starts from now."""
        self._end = None

    def sleep_s(self, now: float, step_s: float) -> float:
        """How long to sleep for a step of ``step_s`` that begins at ``now``."""
        start = now if self._end is None else max(self._end, now - self.max_debt_s)
        self._end = start + step_s
        return max(0.0, self._end - now)


@dataclass(slots=True)
class _Request:
    """One request inside the fake engine."""

    request: GenerateRequest
    base: int
    blocks: BlockChain  # the keys of its prompt's full blocks, then of prompt + output's
    pending: list[GenerateEvent] = field(default_factory=list)  # emitted, not yet taken by ``generate``
    waiter: asyncio.Future[None] | None = None  # set while ``generate`` waits for an event
    generated: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    scripted: tuple[int, ...] | None = None  # FakeEngineConfig.script's reply
    prefilled: bool = False
    done: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def emit(self, event: GenerateEvent) -> None:
        """Hand an event to the request's reader (a list and one future: an asyncio.Queue per request cost a
        getter deque, a putter deque and a future per get)."""
        self.pending.append(event)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class FakeEngine:
    """The fake EngineAdapter (see module docstring)."""

    def __init__(self, config: FakeEngineConfig | None = None) -> None:
        self.config = config or FakeEngineConfig()
        self._weight_version: Callable[[], int] = lambda: 0
        self._frozen = False
        self._running: dict[str, _Request] = {}
        # tokens the running requests hold in the KV cache (prompt + generated), kept as they change: every
        # completion reports the load, which then reads it instead of summing over the running requests
        self._in_kv = 0
        self._waiting: list[tuple[int, int, _Request]] = []  # heap of (-priority, arrival, request)
        self._arrivals = itertools.count()
        self._work = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._cache: OrderedDict[int, None] = OrderedDict()  # block keys, least recently used first
        self._sessions = SessionBlocks(4 * self.config.cache_blocks)  # a few sessions per block (a GRPO prompt)
        self._prompt_tokens_seen = 0
        self._prompt_tokens_cached = 0
        self._groups = LocalWeightGroups()

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self, weight_version: Callable[[], int]) -> ServerFacts:
        self._weight_version = weight_version
        self._loop_task = asyncio.create_task(self._schedule(), name="fake-engine-scheduler")
        return ServerFacts(
            engine_kind="fake",
            engine_version=__version__,
            model_id="fake",
            tokenizer_fingerprint=f"fake-vocab-{self.config.vocab_size}",
            vocab_size=self.config.vocab_size,
            max_model_len=self.config.max_model_len,
            eos_token_ids=(self.config.eos_token_id,),
            dp_rank=self.config.dp_rank,
            dp_size=self.config.dp_size,
            weight_group_ranks=1,
            default_max_new_tokens=self.config.default_max_new_tokens,
            supports_images=self.config.max_images_per_request > 0,
            max_images_per_request=self.config.max_images_per_request,
            routed_expert_layers=self.config.routed_expert_layers,
            routed_experts_per_token=self.config.routed_experts_per_token if self.config.routed_expert_layers else 0,
            num_experts=self.config.num_experts if self.config.routed_expert_layers else 0,
        )

    async def shutdown(self) -> None:
        await self.abort([e.request_id for e in self._entries()])
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    def load(self) -> LoadInfo:
        seen = self._prompt_tokens_seen
        return LoadInfo(
            running_requests=len(self._running),
            waiting_requests=len(self._waiting),
            kv_cache_usage=min(1.0, self._in_kv / (self.config.max_running * self.config.max_model_len)),
            prefix_cache_hit_rate=self._prompt_tokens_cached / seen if seen else 0.0,
            max_running_requests=self.config.max_running,
        )

    # -- generation ------------------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateEvent, None]:
        if request.structured_output is not None:
            raise UnsupportedError("the fake engine does not support structured output")
        if len(self._running) + len(self._waiting) >= self.config.max_running + self.config.max_waiting:
            raise EngineOverloadedError(
                f"the waiting queue is full ({self.config.max_waiting} waiting behind "
                f"{self.config.max_running} running)"
            )
        sampling = request.sampling
        seed = 0 if sampling.greedy else (sampling.seed if sampling.seed is not None else random.getrandbits(63))
        prompt = request.prompt_ids
        whole = zlib.crc32(prompt.raw)  # the whole prompt's hash, the same in every process (unlike hash())
        for item in request.media:  # another picture, another stream (none: the stream of the ids alone)
            whole = zlib.crc32(item.digest(), whole)
        base = _mix(whole ^ _mix((seed & _MASK64) ^ len(prompt)))
        blocks = BlockChain(self.config.block_size, prompt, request.media, root=self._weight_version())
        entry = _Request(request=request, base=base, blocks=blocks)
        if self.config.script is not None:
            entry.scripted = tuple(self.config.script(request))
        heapq.heappush(self._waiting, (-request.priority, next(self._arrivals), entry))
        self._work.set()
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not entry.pending:
                    entry.waiter = loop.create_future()
                    await entry.waiter
                events, entry.pending = entry.pending, []
                end = events.pop() if isinstance(events[-1], GenerateComplete) else None
                # a slow reader takes what piled up at once: fewer, larger chunks (one per weight version)
                for chunk in merge_chunks(events):  # type: ignore[arg-type]  # the end was popped: chunks only
                    yield chunk
                if end is not None:
                    yield end
                    return
        finally:
            if not entry.done:
                self._finish(entry, FinishReason.ABORT)

    def _entries(self) -> list[_Request]:
        return [e for _, _, e in self._waiting] + list(self._running.values())

    async def abort(self, request_ids: Sequence[str]) -> None:
        wanted = set(request_ids)
        for entry in self._entries():
            if entry.request_id in wanted:
                self._finish(entry, FinishReason.ABORT)

    # -- scheduler -------------------------------------------------------------------------------------------

    async def _schedule(self) -> None:
        """One decode step per iteration: admit, prefill newcomers, decode one token for every running request.

        Steps are timed on a clock anchored at the previous step's planned end, so a step takes the configured
        time however late the event loop wakes us (as a real engine's device time does not stretch with the
        host's scheduling slack); the anchor resets when the engine idles.
        """
        loop = asyncio.get_running_loop()
        clock = StepClock()
        while True:
            if self._frozen or not (self._running or self._waiting):
                self._work.clear()
                await self._work.wait()
                clock.reset()
                continue
            while self._waiting and len(self._running) < self.config.max_running:
                _, _, entry = heapq.heappop(self._waiting)
                self._running[entry.request_id] = entry
                self._in_kv += len(entry.request.prompt_ids)
            newcomers = [e for e in self._running.values() if not e.prefilled]
            uncached = 0
            for entry in newcomers:  # each stores before the next looks up: newcomers of one step share a prefix
                uncached += self._prefill(entry)
                self._store(entry.blocks.keys)
                self._note(entry)
            step_s = self.config.prefill_latency_s_per_token * uncached + self.config.token_latency_s
            if step_s:
                await asyncio.sleep(clock.sleep_s(loop.time(), step_s))
                if self._frozen:  # PAUSE_MODE_KEEP arrived during the step: keep the requests, emit nothing
                    continue
            for entry in list(self._running.values()):
                if entry.prefilled:
                    self._decode_one(entry)
            if not step_s and (self._running or self._waiting):
                # a step of no time still yields once, after its tokens: readers take them and new requests
                # arrive before the next step (a yield between prefill and decode cost every request a pass of
                # the event loop more)
                await asyncio.sleep(0)

    def _prefill(self, entry: _Request) -> int:
        """Look the prompt up in the prefix cache; return the number of tokens to compute."""
        prompt_len = len(entry.request.prompt_ids)
        size = self.config.block_size
        # only blocks that end before the last prompt token: a request always computes at least one token
        keys = entry.blocks.keys[: (prompt_len - 1) // size]
        hits = next((i for i, key in enumerate(keys) if key not in self._cache), len(keys))  # _store keeps prefixes
        entry.cached_tokens = hits * size
        entry.prefilled = True
        self._prompt_tokens_seen += prompt_len
        self._prompt_tokens_cached += entry.cached_tokens
        return prompt_len - entry.cached_tokens

    def _store(self, keys: list[int]) -> None:
        """Cache one sequence's block ``keys`` as the most recently used blocks, its head last: the least recently
        used leave first, and of a sequence its tail before its head (as vLLM frees a request's blocks), so what
        stays of a sequence is always a prefix of it."""
        for key in reversed(keys):
            self._cache[key] = None
            self._cache.move_to_end(key)
        while len(self._cache) > self.config.cache_blocks:
            self._sessions.evicted(self._cache.popitem(last=False)[0])

    def _note(self, entry: _Request) -> None:
        """Remember the cached blocks ``entry``'s session holds now (EndSessions demotes them)."""
        if entry.request.session_id:
            # _store just made the chain the most recently used, head last: of a chain longer than the cache, its head
            self._sessions.note(entry.request.session_id, entry.blocks.keys[: self.config.cache_blocks])

    def _decode_one(self, entry: _Request) -> None:
        sampling = entry.request.sampling
        position = len(entry.generated)
        draw = _mix(entry.base + position)
        token = draw % self.config.vocab_size
        if entry.scripted is not None:
            token = entry.scripted[position] if position < len(entry.scripted) else self.config.eos_token_id
        entry.generated.append(token)
        self._in_kv += 1
        logprobs: tuple[float, ...] = ()
        top: tuple[tuple[tuple[int, float], ...], ...] = ()
        if sampling.logprobs:
            logprob = -0.001 - ((draw >> 32) % 8000) / 1000.0
            logprobs = (logprob,)
            if sampling.top_logprobs:
                top = (
                    tuple(
                        ((token + j) % self.config.vocab_size, logprob - 0.5 * j) for j in range(sampling.top_logprobs)
                    ),
                )
        routed = b""
        if sampling.return_routed_experts:  # the forward that sampled it read the token before it
            before = entry.generated[-2] if position else entry.request.prompt_ids[-1]
            routed = self._routing([before], len(entry.request.prompt_ids) - 1 + position)
        entry.emit(TokenChunk((token,), self._weight_version(), logprobs, top, routed))
        if token in sampling.stop_token_ids or (token == self.config.eos_token_id and not sampling.ignore_eos):
            self._finish(entry, FinishReason.STOP, matched=token)
        elif len(entry.generated) >= sampling.max_new_tokens:
            self._finish(entry, FinishReason.LENGTH)

    def _finish(self, entry: _Request, reason: FinishReason, matched: int | None = None) -> None:
        if entry.done:
            return
        entry.done = True
        if self._running.pop(entry.request_id, None) is None:  # never scheduled: waiting
            self._waiting = [item for item in self._waiting if item[2] is not entry]
            heapq.heapify(self._waiting)
        else:
            self._in_kv -= len(entry.request.prompt_ids) + len(entry.generated)
        if entry.prefilled:  # what it generated is reusable too (the next turn's prompt starts with it)
            stored = len(entry.blocks.keys)
            entry.blocks.extend(entry.generated)
            if len(entry.blocks.keys) > stored:  # it completed a block
                self._store(entry.blocks.keys)
                self._note(entry)
        entry.emit(
            GenerateComplete(
                finish_reason=reason,
                prompt_tokens=len(entry.request.prompt_ids),
                completion_tokens=len(entry.generated),
                weight_version=self._weight_version(),
                cached_prompt_tokens=entry.cached_tokens,
                matched_stop_token_id=matched,
                prompt_images=len(entry.request.media),
                prompt_routed_experts=self._routing(list(entry.request.prompt_ids)[:-1], 0)
                if entry.request.sampling.return_routed_experts and entry.prefilled else b"",
            )
        )

    def _routing(self, inputs: Sequence[int], first: int) -> bytes:
        """The stood-in MoE's routing of input tokens ``inputs`` at positions ``first``, ``first + 1``...: a
        function of the token and its position only, so a prompt's routing repeats what decoding reported."""
        config = self.config
        tokens = np.asarray(inputs, dtype=np.uint64)[:, None, None]
        positions = np.arange(first, first + len(inputs), dtype=np.uint64)[:, None, None]
        layers = np.arange(config.routed_expert_layers, dtype=np.uint64)[None, :, None]
        top = np.arange(config.routed_experts_per_token, dtype=np.uint64)[None, None, :]
        # one hashed expert per token, position and layer, then the next ones: distinct within a layer's top-k
        first_expert = (tokens * np.uint64(2654435761) + positions * np.uint64(40503) + layers * np.uint64(97)) >> 7
        return routed_experts.pack((first_expert + top) % np.uint64(config.num_experts), config.num_experts)

    # -- control ---------------------------------------------------------------------------------------------

    async def release(self, resources: frozenset[Resource]) -> None:
        if Resource.KV_CACHE in resources:  # a fake holds no device memory; its prefix cache goes with the KV
            await self.flush_cache()

    async def restore(self, resources: frozenset[Resource]) -> None:
        """Nothing to restore: a fake holds no device memory."""

    async def freeze(self) -> None:
        self._frozen = True

    async def thaw(self) -> None:
        self._frozen = False
        self._work.set()

    async def update_weights(self, tensors: Sequence[NamedTensor], weight_version: int, flush_cache: bool) -> None:
        if flush_cache:
            await self.flush_cache()

    async def join_weight_group(self, group: WeightGroupSpec) -> list[int]:
        return await self._groups.join(group)

    async def receive_weights(
        self, group: str, layout: BucketLayout, weight_version: int, flush_cache: bool, refusal: EngineError | None
    ) -> None:
        await self._groups.receive(group, layout, refusal)  # the bytes really move; the fake has no model to load
        if flush_cache:
            await self.flush_cache()

    async def leave_weight_group(self, group: str) -> None:
        await self._groups.leave(group)

    async def load_weights(self, path: str, weight_version: int, flush_cache: bool) -> tuple[int, int]:
        tensors, read = await asyncio.to_thread(read_checkpoint, path)
        await self.update_weights(tensors, weight_version, flush_cache)
        return len(tensors), read

    async def flush_cache(self) -> None:
        self._cache.clear()
        self._sessions.clear()
        self._prompt_tokens_seen = self._prompt_tokens_cached = 0

    async def end_sessions(self, session_ids: Sequence[str]) -> int:
        return demote(self._cache, self._sessions.end(session_ids))
