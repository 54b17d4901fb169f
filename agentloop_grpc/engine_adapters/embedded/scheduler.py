"""Scheduler: the engine core, one ``step`` at a time in a worker thread (continuous batching).

A step:
1. takes newly submitted requests into the waiting heap (priority, then arrival) and drops aborted ones;
2. admits waiting requests while a KV slot is free; a prefix-cache hit copies cached KV into the new slot;
3. runs one batched decode step for every decoding request (slots ``[0, m)``);
4. prefills up to ``prefill_chunk`` prompt tokens (the oldest prefilling request first, in chunks, the short
   prompts of several requests in one forward), so a long prompt never stalls running decodes for more than one
   chunk; a request whose prompt is complete stores the
   prompt's KV in the prefix cache (later requests with that prefix reuse it while this one still decodes),
   samples its first token and joins the decode batch at the next step;
5. finishes requests (stop id, eos, grammar complete, budget, context) and releases their slots, storing the
   rest of their computed KV (the generated part) in the prefix cache and compacting the slots (see ``kv_cache.py``).

A request that asks for its routed experts (MoE models) gets, with each token, the expert ids of the step that
sampled it, and the prompt's when its prefill is done; its prompt is computed whole, never read from the prefix
cache, whose blocks hold KV but no routing.

It never preempts: each running request owns a slot of ``max_model_len`` positions, so a request admitted always
has room to finish (GetLoad's ``preemptions`` is 0 here).

It returns what each request produced; the async adapter turns that into events. Requests aborted by the event
loop are only flagged; the core releases them at the start of its next step.
"""

from __future__ import annotations

import heapq
import queue
from dataclasses import dataclass

import torch

from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.types import FinishReason

from .images import features
from .prefix_cache import PrefixCache
from .runner import ModelRunner
from .sampling import RequestSampler, SampledToken
from .sequence import Sequence
from .structured import StructuredState


@dataclass(frozen=True, slots=True)
class Emission:
    """A token a request produced in a step, and how the request finished if this was its last."""

    sequence: Sequence
    sampled: SampledToken
    finish: FinishReason | None = None
    matched_stop: int | None = None
    #: The experts the step that sampled the token routed to (packed), when the request asked for them.
    routed_experts: bytes = b""


@dataclass(frozen=True, slots=True)
class PromptChunk:
    """Prompt positions ``[start, end)`` of a request in prefill, computed in this step."""

    sequence: Sequence
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


class Scheduler:
    """Slots, queues and the step loop body (see module docstring)."""

    def __init__(
        self,
        runner: ModelRunner,
        prefix_cache: PrefixCache,
        eos_token_ids: frozenset[int],
        max_running: int,
        max_model_len: int,
        prefill_chunk: int,
        vocab_size: int,
    ) -> None:
        self.runner = runner
        self.prefix_cache = prefix_cache
        self._eos = eos_token_ids
        self._max_running = max_running
        self._max_model_len = max_model_len
        self._prefill_chunk = prefill_chunk
        self._vocab_size = vocab_size
        self._inbox: queue.SimpleQueue[Sequence] = queue.SimpleQueue()
        self._waiting: list[tuple[int, int, Sequence]] = []
        self._slots: list[Sequence] = []  # index == slot; decoding ones first
        self._decoding = 0

    # -- called from the event loop (thread-safe) -------------------------------------------------------------

    def submit(self, sequence: Sequence) -> None:
        self._inbox.put(sequence)

    def has_work(self) -> bool:
        return bool(self._slots or self._waiting or not self._inbox.empty())

    @property
    def kv_usage(self) -> float:
        shape = self.runner.kv.shape
        return min(1.0, sum(s.computed for s in list(self._slots)) / (shape.slots * shape.max_len))

    # -- the step (worker thread) -----------------------------------------------------------------------------

    def step(self) -> list[Emission]:
        self._take_submissions()
        for sequence in [s for s in self._slots if s.aborted]:
            self._release(sequence)
        self._admit()
        emissions = self._decode()
        emissions += self._prefill()
        for emission in emissions:
            if emission.finish is not None:
                self._release(emission.sequence)
        return emissions

    def _take_submissions(self) -> None:
        while not self._inbox.empty():
            sequence = self._inbox.get_nowait()
            request = sequence.request
            sequence.blocks = self.prefix_cache.chain(request.prompt_ids, request.media)  # hashed once, here
            heapq.heappush(self._waiting, (-sequence.request.priority, sequence.arrival, sequence))

    def _admit(self) -> None:
        """Fill free slots from the waiting heap.

        A request whose prompt shares uncached blocks with a prompt being prefilled right now waits until that
        prefill is done and stored, then reuses it: a group of samples of one prompt (GRPO) arriving together
        computes the shared prompt once instead of once per sample.
        """
        in_prefill = self._prefill_keys()
        deferred = []
        while self._waiting and len(self._slots) < self._max_running:
            item = heapq.heappop(self._waiting)
            sequence = item[2]
            if sequence.aborted:
                continue
            cache = self.prefix_cache
            if cache.enabled and sequence.blocks.root != cache.epoch:  # it waited across a flush or weight update
                sequence.blocks = cache.chain(sequence.request.prompt_ids, sequence.request.media)
            keys = cache.prompt_keys(sequence.blocks, sequence.prompt_len)
            if any(key in in_prefill for key in keys):
                deferred.append(item)
                continue
            self._start(sequence)
            in_prefill.update(keys[sequence.cached // self.prefix_cache.block_size :])
        for item in deferred:
            heapq.heappush(self._waiting, item)

    def _prefill_keys(self) -> set[int]:
        """Keys of the uncached prompt blocks that requests in prefill are computing."""
        keys: set[int] = set()
        size = self.prefix_cache.block_size
        for sequence in self._slots[self._decoding :]:
            keys.update(self.prefix_cache.prompt_keys(sequence.blocks, sequence.prompt_len)[sequence.cached // size :])
        return keys

    def _start(self, sequence: Sequence) -> None:
        """Give ``sequence`` the next slot, its sampler and grammar state, and any cached prefix of its prompt."""
        request = sequence.request
        sequence.sampler = RequestSampler(request.sampling, request.prompt_ids, self._vocab_size)
        if sequence.grammar is not None:
            sequence.structured = StructuredState(sequence.grammar, self._vocab_size)
        sequence.slot = len(self._slots)
        sequence.cache_epoch = self.prefix_cache.epoch
        self._slots.append(sequence)
        start = 0
        cached = () if request.sampling.return_routed_experts else self.prefix_cache.lookup(
            sequence.blocks, sequence.prompt_len
        )
        for block in cached:
            self.runner.kv.write(sequence.slot, start, block)
            start += block.shape[3]
        sequence.computed = sequence.cached = start
        self.prefix_cache.record(sequence.prompt_len, start)
        if sequence.images is not None:
            sequence.image_features = features(self.runner.model, sequence.images, start)

    def _decode(self) -> list[Emission]:
        rows = self._slots[: self._decoding]
        if not rows:
            return []
        input_ids = torch.tensor([[s.tokens[-1]] for s in rows])
        positions = torch.tensor([[s.computed] for s in rows])
        wanted = [s.request.sampling.return_routed_experts for s in rows]
        logits, routes = self.runner.forward(
            input_ids, positions, 0, max(s.computed for s in rows) + 1, routing=any(wanted)
        )
        emissions = []
        for row, sequence in enumerate(rows):
            sequence.computed += 1
            routed = self._pack(routes[row, 0]) if routes is not None and wanted[row] else b""
            emissions.append(self._sample(sequence, logits[row], routed))
        return emissions

    def _prefill(self) -> list[Emission]:
        budget = self._prefill_chunk if self._decoding else 4 * self._prefill_chunk
        chunks: list[PromptChunk] = []
        for sequence in self._slots[self._decoding :]:
            if budget <= 0:
                break
            end = min(sequence.prompt_len, sequence.computed + budget)
            budget -= end - sequence.computed
            chunks.append(PromptChunk(sequence, sequence.computed, end))
        emissions = []
        for batch in self._prefill_batches(chunks):
            emissions += self._prefill_batch(batch)
        return emissions

    def _prefill_batches(self, chunks: list[PromptChunk]) -> list[list[PromptChunk]]:
        """The step's prompt chunks (consecutive slots, so consecutive rows) as forwards: one forward reads every
        weight once, so the prompts of a GRPO group or of a burst of short requests are computed together.

        A row is padded to its batch's longest chunk, so a batch grows while its padded size stays within twice its
        real tokens (a short prompt never pays for a long one's chunk); a chunk with images runs alone (a forward
        places one chunk's image features), and a row is never padded past the end of its slot.
        """
        batches: list[list[PromptChunk]] = []
        for chunk in chunks:
            batch = batches[-1] if batches else []
            joined = [*batch, chunk]
            longest = max(c.length for c in joined)
            if (
                batch
                and chunk.sequence.image_features is None
                and batch[0].sequence.image_features is None
                and len(joined) * longest <= 2 * sum(c.length for c in joined)
                and all(c.start + longest <= self.runner.kv.shape.max_len for c in joined)
            ):
                batch.append(chunk)
            else:
                batches.append([chunk])
        return batches

    def _prefill_batch(self, batch: list[PromptChunk]) -> list[Emission]:
        longest = max(chunk.length for chunk in batch)
        input_ids = torch.zeros(len(batch), longest, dtype=torch.long)
        positions = torch.empty(len(batch), longest, dtype=torch.long)
        for row, chunk in enumerate(batch):
            input_ids[row, : chunk.length] = torch.tensor(chunk.sequence.tokens[chunk.start : chunk.end])
            positions[row] = torch.arange(chunk.start, chunk.start + longest)  # padding: positions past its own
        first = batch[0].sequence
        features = first.image_features
        images = features.within(batch[0].start, batch[0].end) if features is not None else None
        wanted = [chunk.sequence.request.sampling.return_routed_experts for chunk in batch]
        logits, routes = self.runner.forward(
            input_ids, positions, first.slot, max(chunk.end for chunk in batch), images, routing=any(wanted),
            last=torch.tensor([chunk.length - 1 for chunk in batch]),
        )
        emissions = []
        for row, chunk in enumerate(batch):
            sequence = chunk.sequence
            sequence.computed = chunk.end
            if routes is not None and wanted[row]:
                sequence.prompt_routes.append(routes[row, : chunk.length])
            if chunk.end < sequence.prompt_len:
                continue  # only a step's last chunk stops short of its prompt's end: the budget ran out there
            sequence.image_features = None  # the prompt is in the KV now
            if sequence.slot != self._decoding:
                raise RuntimeError(f"prefill finished in slot {sequence.slot}, expected {self._decoding}")
            self._decoding += 1
            self._store_prefix(sequence)  # requests with the same prompt arriving from now on reuse it
            routed = b""
            if sequence.prompt_routes:
                prompt = torch.cat(sequence.prompt_routes)
                sequence.prompt_routes.clear()
                sequence.prompt_routed_experts = self._pack(prompt[:-1])
                routed = self._pack(prompt[-1])  # the last prompt position's step samples the first token
            emissions.append(self._sample(sequence, logits[row], routed))
        return emissions

    def _pack(self, routes: torch.Tensor) -> bytes:
        return routed_experts.pack(routes.numpy(), self.runner.num_experts)

    def _sample(self, sequence: Sequence, logits: torch.Tensor, routed: bytes = b"") -> Emission:
        structured = sequence.structured
        sampled = sequence.sampler.sample(logits, structured.allowed() if structured is not None else None)
        token = sampled.token
        sequence.tokens.append(token)
        sequence.generated += 1
        sequence.sampler.observe(token)
        if structured is not None:
            structured.accept(token)
        params = sequence.request.sampling
        if token in params.stop_token_ids or (token in self._eos and not params.ignore_eos):
            return Emission(sequence, sampled, FinishReason.STOP, token, routed)
        if structured is not None and structured.terminated:
            return Emission(sequence, sampled, FinishReason.STOP, routed_experts=routed)
        if sequence.generated >= params.max_new_tokens or len(sequence.tokens) >= self._max_model_len:
            return Emission(sequence, sampled, FinishReason.LENGTH, routed_experts=routed)
        return Emission(sequence, sampled, routed_experts=routed)

    def _release(self, sequence: Sequence) -> None:
        """Free the slot: keep its KV in the prefix cache, then compact the slots (decoding ones stay first)."""
        self._store_prefix(sequence)
        index = sequence.slot
        if index < self._decoding:
            last = self._decoding - 1
            self._slots[index] = self._slots[last]
            del self._slots[last]
            self._decoding -= 1
        else:
            del self._slots[index]
        sequence.slot = -1
        for new_slot, moved in enumerate(self._slots):
            if moved.slot != new_slot:
                self.runner.kv.move(moved.slot, new_slot, moved.computed)
                moved.slot = new_slot

    def _store_prefix(self, sequence: Sequence) -> None:
        cache, blocks = self.prefix_cache, sequence.blocks
        if not cache.enabled or sequence.cache_epoch != cache.epoch:  # part of its KV predates a flush or update
            return
        blocks.extend(sequence.tokens[len(blocks) : sequence.computed])  # its output so far
        for index in cache.missing(blocks, sequence.computed):
            start = index * cache.block_size
            cache.insert(blocks, index, self.runner.kv.read(sequence.slot, start, start + cache.block_size))
        cache.note_session(sequence.request.session_id, blocks, sequence.computed)

    # -- control (called between steps, on the worker thread) ----------------------------------------------

    def clear(self) -> None:
        """Forget every slot and queued request (Sleep: nothing is in flight, only aborted leftovers)."""
        self._take_submissions()
        for sequence in self._slots:
            sequence.slot = -1
        self._slots.clear()
        self._waiting.clear()
        self._decoding = 0
