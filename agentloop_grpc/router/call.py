"""GenerateCall: one generation as a Router's caller asks for it, in domain types (no protobuf)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.common.types import SamplingParams, StructuredOutput

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
UINT64_MAX = 2**64 - 1
#: SamplingParams' integer fields and the wire's bounds on them (generation.proto's field types).
_INT32_FIELDS = ("max_new_tokens", "top_k", "top_logprobs")


@dataclass(frozen=True, slots=True)
class GenerateCall:
    """What to generate, for which session, within which deadline.

    Values the request message cannot carry (a negative seed, an int beyond int32) are refused here with a
    ValueError naming the field and its bound: such a request could not be sent. The engines check the rest (a
    top_p above 1, a stop id beyond the vocabulary) and refuse it as RequestError.
    """

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
    #: The GRPO group (samples of one prompt): the Router places a group's sessions together, so the prompt is
    #: prefilled once per group and server. "": none.
    group_id: str = ""
    #: How many times an ABORT finish (a trainer's Pause(ABORT) for a weight update) is resumed, as a failover is:
    #: the tokens so far appended to the prompt, the budget what is left (attempts.py says the seed and grammar of a
    #: resumed attempt); each token keeps the weight version that made it. 0: an ABORT is the result.
    max_resumes: int = 0

    def __post_init__(self) -> None:
        _check_int32("priority", self.priority)
        if not _integer_in(self.max_resumes, 0, INT32_MAX):
            raise ValueError(f"max_resumes = {self.max_resumes!r} must be an int >= 0")
        if self.timeout_s is not None and not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"timeout_s = {self.timeout_s} must be finite and > 0 (None: the Router's default)")
        if self.sampling is not None:
            check_wire_bounds(self.sampling)


def check_wire_bounds(sampling: SamplingParams, prefix: str = "sampling.") -> None:
    """ValueError naming the first field of ``sampling`` that SamplingParams on the wire cannot carry."""
    seed = sampling.seed
    if seed is not None and not _integer_in(seed, 0, UINT64_MAX):
        raise ValueError(f"{prefix}seed = {seed!r} must be an int in [0, 2**64 - 1] (uint64 on the wire)")
    for name in _INT32_FIELDS:
        value = getattr(sampling, name)
        if not _integer_in(value, INT32_MIN, INT32_MAX):  # the name is built only for the error: every call checks
            _check_int32(prefix + name, value)
    for index, token in enumerate(sampling.stop_token_ids):
        _check_int32(f"{prefix}stop_token_ids[{index}]", token)


def _check_int32(name: str, value: object) -> None:
    if not _integer_in(value, INT32_MIN, INT32_MAX):
        raise ValueError(f"{name} = {value!r} must be an int in [-2**31, 2**31 - 1] (int32 on the wire)")


def _integer_in(value: object, low: int, high: int) -> bool:
    """Whether ``value`` is an integer as protobuf takes them (``__index__``, numpy's too; not a bool) in [low,
    high]."""
    if type(value) is int:  # the common case, checked without operator.index
        return low <= value <= high
    if isinstance(value, bool):
        return False
    try:
        return low <= operator.index(value) <= high  # type: ignore[arg-type]
    except TypeError:
        return False
