"""The SGLang adapter: one gRPC server per DP group, calling the TP-rank-0 Ray actor that holds ``sgl.Engine``.

Imported as ``agentloop_grpc.engine_adapters.sglang``. Deploy ``SglangEngineActor`` on every TP rank under the
names ``ActorNaming`` gives (``deploy_tp_group`` does it), then serve ``SglangEngine(SglangEngineConfig(...))``.
Only the rank-0 actor's process imports sglang (``api.py``); the engine, its discovery and deployment need Ray
and are imported on first use, so the config (``ActorNaming``, ``SglangEngineConfig``) is importable without it.
"""

import importlib

from .actor import SglangEngineActor
from .api import TARGET_VERSION, SglangApi
from .config import ActorNaming, SglangEngineConfig, TpRank


def __getattr__(name: str) -> object:
    # on first use: importing Ray takes seconds
    modules = {"deploy_tp_group": ".deploy", "TpGroupError": ".discovery", "SglangEngine": ".engine"}
    if name not in modules:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(modules[name], __name__), name)


__all__ = [
    "TARGET_VERSION",
    "ActorNaming",
    "SglangApi",
    "SglangEngine",
    "SglangEngineActor",
    "SglangEngineConfig",
    "TpGroupError",
    "TpRank",
    "deploy_tp_group",
]
