"""Our validated request -> vLLM's ``SamplingParams``: every field mapped, none silently dropped.

Every field of ``types.SamplingParams`` and ``StructuredOutput`` has a vLLM counterpart (``return_routed_experts`` an
engine argument and the finished output's routing: ``routing.py``), so nothing here is
refused as unsupported; a field added to ``types.py`` later must be mapped here (``tests/vllm/test_mapping.py``
checks that every field is accounted for). Semantics chosen to match the embedded engine:

- logprobs are vLLM's *processed* logprobs (the engine is started with ``logprobs_mode="processed_logprobs"``):
  under the distribution the token was drawn from, after penalties, temperature, top-k/top-p/min-p;
- ``top_logprobs = k`` asks vLLM for k alternatives; vLLM adds the sampled token when it is not among them,
  and ``outputs.py`` keeps exactly the k best;
- output is streamed as deltas (``RequestOutputKind.DELTA``) and never detokenized: we return token ids only,
  and stop strings do not exist in our contract.
"""

from __future__ import annotations

from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.sampling_params import SamplingParams as VllmSamplingParams

from agentloop_grpc.common.types import GenerateRequest, StructuredOutput

# Our structured-output kinds -> StructuredOutputsParams keyword (the EBNF dialect is xgrammar's GBNF, which
# is what vLLM's default structured-output backend compiles).
_STRUCTURED_FIELDS = {"json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar"}

#: The fields of ``types.SamplingParams`` this module maps (the unit test compares with the dataclass).
MAPPED_FIELDS = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "stop_token_ids",
        "ignore_eos",
        "logprobs",
        "top_logprobs",
        # not a vLLM sampling parameter: vLLM returns routing for every request of an engine started with it
        # (VllmEngineConfig.return_routed_experts); engine.py reads it for the requests that ask (routing.py)
        "return_routed_experts",
    }
)


def structured_outputs(spec: StructuredOutput | None) -> StructuredOutputsParams | None:
    if spec is None:
        return None
    return StructuredOutputsParams(**{_STRUCTURED_FIELDS[spec.kind]: spec.spec})


def to_vllm(request: GenerateRequest) -> VllmSamplingParams:
    """vLLM's sampling parameters for ``request`` (already validated by the servicer)."""
    params = request.sampling
    return VllmSamplingParams(
        max_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=0 if params.top_k in (-1, 0) else params.top_k,
        min_p=params.min_p,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        logprobs=params.top_logprobs if params.logprobs or params.top_logprobs else None,
        structured_outputs=structured_outputs(request.structured_output),
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
        skip_special_tokens=False,
    )


def priority(request: GenerateRequest) -> int:
    """vLLM schedules lower values first; our contract schedules higher values first."""
    return -request.priority
