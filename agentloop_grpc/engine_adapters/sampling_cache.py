"""SamplingCache: a request's resolved, validated SamplingParams, reused for the next request that sends the same.

RL rollouts send the same sampling settings call after call. Reading the optional fields (HasField each),
resolving defaults, validating and building the frozen dataclass is a large share of the servicer's own work on
a short call, and a lookup by the params' wire bytes costs far less (figures in NOTES.md). The budget is resolved
and checked against the prompt's room on every request (an unset max_new_tokens
means "all the room left", which depends on the prompt), and is part of the key. Bounded: when full, emptied.
"""

from __future__ import annotations

from agentloop_grpc.v1 import generation_pb2

from . import validation
from .convert import sampling_from_proto
from agentloop_grpc.common.types import SamplingParams, ServerInfo


class SamplingCache:
    """Resolved SamplingParams by (wire bytes, resolved budget, vocabulary size); see the module docstring."""

    def __init__(self, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self._entries: dict[tuple[bytes, int, int], SamplingParams] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def resolve(self, params: generation_pb2.SamplingParams, prompt_len: int, info: ServerInfo) -> SamplingParams:
        """``convert.sampling_from_proto``, from the cache when the same params were resolved before."""
        requested = params.max_new_tokens if params.HasField("max_new_tokens") else None
        budget = validation.resolve_max_new_tokens(requested, prompt_len, info)
        key = (params.SerializeToString(deterministic=True), budget, info.vocab_size)
        sampling = self._entries.get(key)
        if sampling is None:
            sampling = sampling_from_proto(params, prompt_len, info)  # raises for invalid params: nothing stored
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = sampling
        return sampling
