"""EngineConfig: the config of any adapter, one pydantic model per adapter told apart by its ``kind`` field.

A YAML file, a rollout config's ``engines.launch.engine`` section and ``agentloop engine serve --config/--set``
all read into this union, so an adapter's knobs are declared once, in its own config module. Importing it loads
no engine (no torch, vLLM or Ray).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, get_args

from pydantic import Field

from .embedded.config import EmbeddedEngineConfig
from .fake_config import FakeEngineConfig
from .sglang.config import SglangEngineConfig
from .vllm.config import VllmEngineConfig

EngineConfig = Annotated[
    EmbeddedEngineConfig | VllmEngineConfig | SglangEngineConfig | FakeEngineConfig, Field(discriminator="kind")
]

_MODELS: tuple[type[EngineConfig], ...] = get_args(get_args(EngineConfig)[0])

#: The adapters' names (the ``kind`` of each config), in the order above.
ENGINE_KINDS: tuple[str, ...] = tuple(model.model_fields["kind"].default for model in _MODELS)


def engine_config(kind: str, config: EngineConfig | Mapping[str, Any] | None = None) -> EngineConfig:
    """The config of adapter ``kind``: ``config`` itself (its kind must be ``kind``), or ``config``'s fields
    validated as that adapter's config (a ValidationError names the field at fault)."""
    if kind not in ENGINE_KINDS:
        raise ValueError(f"no adapter is named {kind!r} (adapters: {', '.join(ENGINE_KINDS)})")
    if config is None or isinstance(config, Mapping):
        fields = dict(config or {})
        if fields.setdefault("kind", kind) != kind:
            raise ValueError(f"the config is for the {fields['kind']} adapter, not {kind}")
        return _MODELS[ENGINE_KINDS.index(kind)].model_validate(fields)
    if config.kind != kind:
        raise ValueError(f"a {type(config).__name__} configures the {config.kind} adapter, not {kind}")
    return config
