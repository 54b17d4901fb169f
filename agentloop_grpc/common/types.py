"""Domain types shared by the servicer and every engine adapter.

Adapters never see protobuf messages: the servicer converts at the boundary (``convert.py``), so an adapter is
plain Python that can be unit-tested and reused without gRPC. Everything here is immutable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from .media import MediaInput
from .prompt import PromptIds


class FinishReason(enum.Enum):
    """Why a generation ended."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class EngineState(enum.Enum):
    """Lifecycle state of an engine (mirrors agentloop.v1.EngineState)."""

    LOADING = "loading"
    RUNNING = "running"
    PAUSED = "paused"
    SLEEPING = "sleeping"
    DRAINING = "draining"


class PauseMode(enum.Enum):
    """What Pause does with in-flight requests."""

    ABORT = "abort"
    KEEP = "keep"
    WAIT = "wait"


class Resource(enum.Enum):
    """A resource that Sleep releases and WakeUp restores."""

    WEIGHTS = "weights"
    KV_CACHE = "kv_cache"


ALL_RESOURCES = frozenset(Resource)

StructuredKind = Literal["json_schema", "regex", "ebnf_grammar"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling of one request, with every default resolved (``max_new_tokens`` is concrete)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    #: Report the experts each token was routed to (TokenChunk.routed_experts); engines that cannot refuse it.
    return_routed_experts: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A formal-language constraint on the output."""

    kind: StructuredKind
    spec: str


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One generation request. From the wire, the servicer builds it once its validation catalogue
    (``engine_adapters/validation.py``) checked every field (ids in the vocabulary, sampling in bounds); this class
    checks none of that, so a caller building one in process (tests, an adapter used without gRPC) passes valid
    values.

    ``prompt_ids`` is kept as PromptIds (the int32 ids as they came off the wire, see ``prompt.py``); any other
    iterable of ints (a list, a tuple, a NumPy array: tests and in-process callers) is packed into one, and a value
    that is not an int32 integer is a ValueError."""

    request_id: str
    prompt_ids: PromptIds
    sampling: SamplingParams
    session_id: str = ""
    structured_output: StructuredOutput | None = None
    priority: int = 0
    #: The prompt's images, in the order of their spans (checked against the prompt by the servicer).
    media: tuple[MediaInput, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_ids, PromptIds):
            object.__setattr__(self, "prompt_ids", PromptIds(self.prompt_ids))


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """Consecutive generated tokens; ``logprobs`` and ``top_logprobs`` are empty unless requested."""

    token_ids: tuple[int, ...]
    weight_version: int
    logprobs: tuple[float, ...] = ()
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    #: Each token's routed expert ids, packed as agentloop.v1 TokenChunk.routed_experts says; b"" unless asked.
    routed_experts: bytes = b""


@dataclass(frozen=True, slots=True)
class GenerateComplete:
    """The end of a generation: exactly one per request, after its chunks."""

    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    weight_version: int
    cached_prompt_tokens: int = 0
    matched_stop_token_id: int | None = None
    #: Images the engine read for the prompt.
    prompt_images: int = 0
    #: The prompt's routed expert ids (GenerateComplete.prompt_routed_experts); b"" unless asked.
    prompt_routed_experts: bytes = b""


GenerateEvent = TokenChunk | GenerateComplete


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What an engine is, known once it loaded and fixed from then on; GetServerInfo adds the dynamic state
    (``EngineState`` and the weight version) that the servicer keeps."""

    engine_kind: str
    engine_version: str
    model_id: str
    tokenizer_fingerprint: str
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    dp_rank: int = 0
    dp_size: int = 1
    tp_size: int = 1
    sleep_releases_memory: bool = False
    supports_structured_output: bool = False
    weight_group_ranks: int = 0  # workers that join a weight-transfer group; 0: the engine cannot join one
    default_max_new_tokens: int = 0  # the budget of a request that sets none; 0: up to max_model_len
    supports_images: bool = False
    max_images_per_request: int = 0
    routed_expert_layers: int = 0  # MoE layers whose routing the engine reports; 0: it cannot report routing
    routed_experts_per_token: int = 0
    num_experts: int = 0


@dataclass(frozen=True, slots=True)
class LoadInfo:
    """What GetLoad reports."""

    running_requests: int
    waiting_requests: int
    kv_cache_usage: float
    prefix_cache_hit_rate: float
    max_running_requests: int
    #: Requests preempted (KV freed, recomputed later) since the engine started; 0 where it never preempts or
    #: cannot tell (each adapter's docstring says which).
    preemptions: int = 0


@dataclass(frozen=True, slots=True)
class PauseResult:
    """What Pause did with in-flight requests."""

    aborted_requests: int = 0
    kept_requests: int = 0


@dataclass(frozen=True, slots=True)
class NamedTensor:
    """A complete tensor received by UpdateWeights (row-major little-endian bytes)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class WeightUpdateResult:
    """The outcome of an applied weight update."""

    weight_version: int
    tensors_updated: int
