"""GenerateCall: one generation as a Router's caller asks for it, in domain types (no protobuf)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.common.types import SamplingParams, StructuredOutput


@dataclass(frozen=True, slots=True)
class GenerateCall:
    """What to generate, for which session, within which deadline."""

    #: The trajectory the call belongs to: its calls stick to one server (prefix cache) and ``Router.abort`` ends
    #: them together.
    session_id: str
    #: Token ids, sent as int32 bytes: a ``PromptIds`` or an ``array('i')`` (an agent loop's growing context) as
    #: they are, other sequences packed.
    prompt_ids: Sequence[int]
    #: None: the server's defaults (its budget runs to the end of the model's context).
    sampling: SamplingParams | None = None
    structured_output: StructuredOutput | None = None
    priority: int = 0
    #: Deadline of the whole call, failovers included; None: ``RouterConfig.generate_timeout_s``.
    timeout_s: float | None = None
    #: None: the Router makes a unique one. A resumed attempt sends ``<request_id>.<attempt>``.
    request_id: str | None = None
    #: The prompt's images, in the order of their spans in ``prompt_ids`` (GenerateRequest.media).
    media: Sequence[MediaInput] = ()
