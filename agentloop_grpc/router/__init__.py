"""The streaming router client: sticky sessions, load-aware balancing, health watch, failover with resume.

``Router`` is the entry point; ``RouterConfig`` its knobs; ``GenerateResult`` what a generation returns;
``RequestError`` / ``InfrastructureError`` tell the caller's fault from the infrastructure's.
"""

from .config import RouterConfig
from .errors import InfrastructureError, NoHealthyServerError, RequestError, RouterError
from .fanout import FanOutResult
from .result import GenerateResult
from .router import Router

__all__ = [
    "FanOutResult",
    "GenerateResult",
    "InfrastructureError",
    "NoHealthyServerError",
    "RequestError",
    "Router",
    "RouterConfig",
    "RouterError",
]
