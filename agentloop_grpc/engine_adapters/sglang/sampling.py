"""Our validated GenerateRequest as the keyword arguments of SGLang's ``Engine.async_generate``.

Images: SGLang decodes ``input_ids`` to text and runs the model's processor on it with ``image_data``, which expands
every image placeholder it finds, so each image's span (sent expanded) goes as the one placeholder id
(``image_placeholders.py``) and the picture as a base64 data URL, in span order (see ``api.py``).

Fields map one to one onto SGLang's ``SamplingParams`` (see ``api.py``) with three translations: our ``top_k`` 0
("disabled") is SGLang's -1 (SGLang rejects 0); ``seed`` is ``sampling_seed``; ``ebnf_grammar`` is ``ebnf``.
``no_stop_trim`` keeps a matched stop token in the output, which the contract reports as a generated token.
``return_routed_experts`` is a request field of its own (asked only of an engine whose facts report routing).
"""

from __future__ import annotations

from typing import Any

from agentloop_grpc.common.types import GenerateRequest

from .. import validation
from ..image_placeholders import collapse_images

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


def image_data(request: GenerateRequest) -> list[str]:
    """The request's pictures as SGLang's ``image_data``: data URLs (SGLang decodes base64 ones itself)."""
    return [item.data_url() for item in request.media]


def generate_kwargs(
    request: GenerateRequest, image_token_id: int | None = None, cache_salt: str | None = None
) -> dict[str, Any]:
    """Everything ``Engine.async_generate`` gets for one streamed request (``rid`` is our request id, so
    ``abort_request(rid=...)`` reaches it). A request with images needs the model's ``image_token_id``;
    ``cache_salt`` (SGLang's radix-cache namespace) keeps the prefix blocks of each weight version apart."""
    kwargs = {
        "input_ids": request.prompt_ids.tolist(),
        "sampling_params": sampling_params(request),
        "return_logprob": request.sampling.logprobs,
        "top_logprobs_num": request.sampling.top_logprobs,
        "logprob_start_len": OUTPUT_ONLY,
        "stream": True,
        "rid": request.request_id,
    }
    if cache_salt is not None:
        kwargs["cache_salt"] = cache_salt
    if request.sampling.return_routed_experts:  # only asked of an engine whose facts report routing
        kwargs["return_routed_experts"] = True
    if request.media:
        if image_token_id is None:
            raise validation.media_unsupported()
        kwargs["input_ids"] = collapse_images(request.prompt_ids, request.media, image_token_id)
        kwargs["image_data"] = image_data(request)
    return kwargs
