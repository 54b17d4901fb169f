"""make_adapter: the one place an adapter is built from its kind and config (the CLI, the contract fixtures and
the benchmarks all call it). Each adapter is imported only when asked for: vLLM, torch and Ray take seconds to
import, and vLLM or SGLang may not be installed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentloop_grpc.extras import needs_extra

from .config import EngineConfig, engine_config
from .protocol import EngineAdapter


def make_adapter(kind: str, config: EngineConfig | Mapping[str, Any] | None = None) -> EngineAdapter:
    """The adapter ``kind`` (fake, embedded, vllm, sglang) built from ``config``: its config model, or a mapping
    of that model's fields (validated here; None: every default)."""
    config = engine_config(kind, config)
    match config.kind:
        case "fake":
            from .fake import FakeEngine

            return FakeEngine(config)
        case "embedded":
            with needs_extra("the embedded engine", "embedded"):
                from .embedded.engine import EmbeddedEngine

            return EmbeddedEngine(config)
        case "vllm":
            with needs_extra("the vllm adapter", "vllm", "vllm-cpu"):
                from .vllm.engine import VllmEngine

            return VllmEngine(config)
        case "sglang":
            with needs_extra("the sglang adapter", "sglang"):
                from .sglang.engine import SglangEngine

            return SglangEngine(config)
    raise AssertionError(f"no adapter for {config.kind}")  # the union and this match list the same kinds
