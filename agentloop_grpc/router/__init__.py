"""The router client: sticky sessions, load-aware balancing, health watch, failover with resume.

``Router`` is the entry point for generation: ``generate`` / ``stream`` a ``GenerateCall``, get a
``GenerateResult``. Its ``Fleet`` (``router.fleet``, or a Fleet of its own for a caller that only steers the
engines) holds the servers and fans control calls out to them, each server's answer in domain types
(``FanOutResult``: ``ServerInfo``, ``WeightsApplied``, ...); Fleets over the same engines may share one
``ExpectedVersion`` (the fleet's weight version). ``RouterConfig`` holds the knobs;
``RequestError`` / ``InfrastructureError`` tell the caller's fault from the infrastructure's.
"""

from .call import GenerateCall
from .config import RouterConfig
from .errors import InfrastructureError, NoHealthyServerError, RequestError, RouterError
from .fanout import FanOutResult
from .fleet import Fleet
from .replies import ServerInfo, WeightsApplied
from .result import GenerateResult
from .router import Router
from .versions import ExpectedVersion

__all__ = [
    "ExpectedVersion",
    "FanOutResult",
    "Fleet",
    "GenerateCall",
    "GenerateResult",
    "InfrastructureError",
    "NoHealthyServerError",
    "RequestError",
    "Router",
    "RouterConfig",
    "RouterError",
    "ServerInfo",
    "WeightsApplied",
]
