"""Our validated GenerateRequest as the keyword arguments of SGLang's ``Engine.async_generate``.

Fields map one to one onto SGLang's ``SamplingParams`` (see ``api.py``) with three translations: our ``top_k`` 0
("disabled") is SGLang's -1 (SGLang rejects 0); ``seed`` is ``sampling_seed``; ``ebnf_grammar`` is ``ebnf``.
``no_stop_trim`` keeps a matched stop token in the output, which the contract reports as a generated token.
"""

from __future__ import annotations

from typing import Any

from agentloop_grpc.common.types import GenerateRequest

_STRUCTURED_KEYS = {"json_schema": "json_schema", "regex": "regex", "ebnf_grammar": "ebnf"}
#: logprob_start_len -1: logprobs of output tokens only, none for the prompt.
OUTPUT_ONLY = -1


def sampling_params(request: GenerateRequest) -> dict[str, Any]:
    sampling = request.sampling
    params: dict[str, Any] = {
        "max_new_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "min_p": sampling.min_p,
        "repetition_penalty": sampling.repetition_penalty,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "ignore_eos": sampling.ignore_eos,
        "no_stop_trim": True,
    }
    if sampling.stop_token_ids:
        params["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    if request.structured_output is not None:
        params[_STRUCTURED_KEYS[request.structured_output.kind]] = request.structured_output.spec
    return params


def generate_kwargs(request: GenerateRequest) -> dict[str, Any]:
    """Everything ``Engine.async_generate`` gets for one streamed request (``rid`` is our request id, so
    ``abort_request(rid=...)`` reaches it)."""
    return {
        "input_ids": list(request.prompt_ids),
        "sampling_params": sampling_params(request),
        "return_logprob": request.sampling.logprobs,
        "top_logprobs_num": request.sampling.top_logprobs,
        "logprob_start_len": OUTPUT_ONLY,
        "stream": True,
        "rid": request.request_id,
    }
