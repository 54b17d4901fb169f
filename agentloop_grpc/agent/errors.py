"""How a loop tells the causes of a failed trajectory apart.

Infrastructure (a dead engine or tool server, a deadline) is not the model's doing: the trajectory is flagged
``infrastructure_failure`` and must be dropped, not trained on as a bad answer. A ``LoopError`` is the sample's or
the loop's (a prompt too long, an unknown interaction, drift under strict checking).
"""

from __future__ import annotations

from agentloop_grpc.router.errors import InfrastructureError, RequestError
from agentloop_grpc.tools.client import ToolInfrastructureError, ToolRequestError


class LoopError(Exception):
    """The sample or the loop cannot go on (not an infrastructure failure)."""


INFRASTRUCTURE_ERRORS = (InfrastructureError, ToolInfrastructureError)
REQUEST_ERRORS = (RequestError, ToolRequestError, LoopError)
