"""What the rank-0 actor reports about its engine: once at start (``EngineFacts``) and when polled (``EngineLoad``).

Plain frozen data, so it crosses Ray without SGLang types. The adapter answers GetServerInfo and GetLoad from
these without a round trip (both must be cheap: info() runs before every Generate, routers poll GetLoad).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .routing import RoutingLayout, layout_of


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """Static facts about a started engine."""

    engine_version: str
    model_path: str
    tokenizer_fingerprint: str
    vocab_size: int
    context_len: int
    eos_token_ids: tuple[int, ...]
    #: SGLang frees GPU memory on release_memory_occupation only when started with enable_memory_saver.
    memory_saver: bool
    #: The placeholder id SGLang's processor expands into an image's ids; None: the model takes no images.
    image_token_id: int | None = None
    #: The routing rows SGLang returns (started with enable_return_routed_experts, a MoE model); None: it cannot.
    routing: RoutingLayout | None = None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """SGLang's own load snapshot (first DP rank of the engine: one engine serves one DP group)."""

    running_requests: int
    waiting_requests: int
    kv_cache_usage: float
    prefix_cache_hit_rate: float
    max_running_requests: int


def read_facts(engine: Any, version: str, model_path: str) -> EngineFacts:
    """Facts from the engine's TokenizerManager (attributes cited in ``api.py``)."""
    from agentloop_grpc.common.tokenizer_fingerprint import tokenizer_fingerprint  # the digest every adapter reports

    manager = engine.tokenizer_manager
    eos = manager.model_config.hf_eos_token_id or set()
    image_token_id = None
    if manager.model_config.is_multimodal:  # SGLang's processor expands the config's image token id
        image_token_id = getattr(manager.model_config.hf_config, "image_token_id", None)
    routing = None
    if manager.config_value("enable_return_routed_experts"):  # a dense model has none to return: None
        routing = layout_of(manager.model_config.hf_text_config)
    return EngineFacts(
        engine_version=version,
        model_path=model_path,
        tokenizer_fingerprint=tokenizer_fingerprint(manager.tokenizer),
        vocab_size=int(manager.model_config.vocab_size),
        context_len=int(manager.context_len),
        eos_token_ids=tuple(sorted(int(t) for t in eos)),
        memory_saver=bool(manager.config_value("enable_memory_saver")),
        image_token_id=None if image_token_id is None else int(image_token_id),
        routing=routing,
    )


def read_load(snapshots: list[Any]) -> EngineLoad:
    """``TokenizerManager.get_loads()`` as an EngineLoad (zeros if SGLang returned nothing)."""
    if not snapshots:
        return EngineLoad(0, 0, 0.0, 0.0, 0)
    first = snapshots[0]
    return EngineLoad(
        running_requests=int(first.num_running_reqs),
        waiting_requests=int(first.num_waiting_reqs),
        kv_cache_usage=float(first.token_usage),
        prefix_cache_hit_rate=float(first.cache_hit_rate),
        max_running_requests=int(first.max_running_requests),
    )
