"""verl's sampling-params dict (the keys verl's agent loops and rollout servers pass, vLLM's names) -> ours.

Every key verl may send is either mapped or refused by name: a key silently dropped would sample differently from
what the trainer was told. Text-side keys (detokenization) have no effect on ids and are accepted as such.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.router.call import check_wire_bounds

_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
#: vLLM keys about the text only: the engine returns ids, never text, so they change nothing.
TEXT_ONLY = frozenset({"skip_special_tokens", "spaces_between_special_tokens", "detokenize",
                       "include_stop_str_in_output"})


def sampling_from_verl(params: Mapping[str, Any], default_max_tokens: int) -> SamplingParams:
    """Ours for verl's ``params``; ``default_max_tokens`` when neither ``max_tokens`` nor ``max_new_tokens`` is
    given (verl's servers default to the rollout's response length). ValueError names a key with no equivalent."""
    rest = dict(params)
    fields: dict[str, Any] = {}
    for name in _FLOATS:
        value = rest.pop(name, None)
        if value is not None:
            if not math.isfinite(float(value)):
                raise ValueError(f"verl sampling param {name!r} = {value!r} must be finite")
            fields[name] = float(value)
    max_tokens = rest.pop("max_tokens", None)
    max_new_tokens = rest.pop("max_new_tokens", None)
    fields["max_new_tokens"] = int(next((v for v in (max_tokens, max_new_tokens) if v is not None), default_max_tokens))
    top_k = rest.pop("top_k", None)
    if top_k is not None:
        fields["top_k"] = -1 if int(top_k) in (0, -1) else int(top_k)
    logprobs = rest.pop("logprobs", None)
    if logprobs is not None and logprobs is not False:  # True / 0: the sampled token's; k > 0: also the k best
        fields["logprobs"] = True
        if logprobs is not True and int(logprobs) > 0:
            fields["top_logprobs"] = int(logprobs)
    seed = rest.pop("seed", None)
    if seed is not None:
        fields["seed"] = int(seed)
    if rest.get("stop_token_ids"):
        fields["stop_token_ids"] = tuple(int(t) for t in rest.pop("stop_token_ids"))
    rest.pop("stop_token_ids", None)
    if "ignore_eos" in rest:
        fields["ignore_eos"] = bool(rest.pop("ignore_eos"))
    if int(rest.pop("n", 1)) != 1:
        raise ValueError("verl sampling param 'n' must be 1: each agent loop asks for one sample per call")
    if rest.pop("stop", None):
        raise ValueError("verl sampling param 'stop' (strings) has no agentloop.v1 equivalent: engines return ids, "
                         "pass stop_token_ids")
    unknown = sorted(set(rest) - TEXT_ONLY)
    if unknown:
        raise ValueError(f"verl sampling params {unknown} have no agentloop.v1 equivalent")
    sampling = SamplingParams(**fields)
    try:  # a seed verl passes through unchecked, an id beyond int32: refused here, not once the request is built
        check_wire_bounds(sampling, prefix="")
    except ValueError as error:  # named as ours: max_tokens is max_new_tokens, logprobs' k is top_logprobs
        raise ValueError(f"verl sampling params: {error}") from None
    return sampling
