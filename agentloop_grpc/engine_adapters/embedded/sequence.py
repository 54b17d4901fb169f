"""Sequence: one request's life inside the embedded engine, shared by the async front and the scheduler core.

Ownership is split by thread. The event loop (the adapter) owns ``events``, ``emitted`` and ``closed`` (set
once the completion was queued) and sets ``aborted``; the scheduler core, which runs in a worker thread one step
at a time, owns everything else (tokens, slot, KV progress, the sampler and grammar state) and only reads
``aborted``. The sampler and grammar state hold torch tensors, so the core creates them at admission: only one
thread may run torch operations (see engine.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch
import xgrammar as xgr

from agentloop_grpc.common.types import GenerateEvent, GenerateRequest

from ..block_hash import BlockChain
from .images import ImageFeatures, PromptImages
from .sampling import RequestSampler
from .structured import StructuredState


@dataclass(slots=True, eq=False)
class Sequence:
    request: GenerateRequest
    grammar: xgr.CompiledGrammar | None
    arrival: int
    tokens: list[int]
    #: The prompt's images as the processor prepared them (read before submission); None without images.
    images: PromptImages | None = None
    events: asyncio.Queue[GenerateEvent | Exception] = field(default_factory=asyncio.Queue)
    #: KV slot while scheduled, -1 otherwise.
    slot: int = -1
    #: Created by the core at admission.
    sampler: RequestSampler | None = None
    structured: StructuredState | None = None
    #: Tokens whose KV is in the slot (prompt tokens during prefill, then every token but the last sampled one).
    computed: int = 0
    #: Prompt tokens served from the prefix cache.
    cached: int = 0
    #: The prefix cache's epoch when the request started: its KV is stored only if no clear happened since.
    cache_epoch: int = 0
    #: Prefix-cache keys of its full blocks (the prompt's, then its output's as stored), made by the core when it
    #: takes the request.
    blocks: BlockChain | None = None
    #: Vision features of the image tokens its prefill still computes, made by the core at admission.
    image_features: ImageFeatures | None = None
    generated: int = 0
    #: The prompt's routed experts (GenerateComplete.prompt_routed_experts), set once, by the core, when the
    #: prompt is computed and the request asked for routing; the event loop reads it when it closes the request.
    prompt_routed_experts: bytes = b""
    #: The prompt's routing per prefill chunk (``[T, layers, k]``), until the prompt is computed (core).
    prompt_routes: list[torch.Tensor] = field(default_factory=list)
    #: Tokens queued on ``events`` (event loop).
    emitted: int = 0
    aborted: bool = False
    closed: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len
