"""The SGLang adapter: one gRPC server per DP group, calling the TP-rank-0 Ray actor that holds ``sgl.Engine``.

Imported as ``agentloop_grpc.engine_adapters.sglang``. Deploy ``SglangEngineActor`` on every TP rank under the
names ``ActorNaming`` gives (``deploy_tp_group`` does it), then serve ``SglangEngine(SglangEngineConfig(...))``.
Importing this package needs Ray, not sglang: only the rank-0 actor's process imports sglang (``api.py``).
"""

from .actor import SglangEngineActor
from .api import TARGET_VERSION, SglangApi
from .config import ActorNaming, SglangEngineConfig, TpRank
from .deploy import deploy_tp_group
from .discovery import TpGroupError
from .engine import SglangEngine

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
