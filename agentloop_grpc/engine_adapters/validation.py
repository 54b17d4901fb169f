"""The catalogue of request validation: every message a client can get back as INVALID_ARGUMENT.

All checks run in the servicer, before an adapter sees the request, so every engine rejects the same inputs
with the same words. Each message names the field and the bound that was violated, and quotes at most a short
prefix of the input (``quote``): a message is sent as status metadata, which gRPC bounds.

Sizes are bounded in UTF-8 bytes, as the contract documents them (generation.proto): ids at 256 bytes (a uuid is
36; an id is stored per request and quoted in errors), constraints at 64 KiB each (a tool-call schema is a few
KB, and an engine's compile work grows with the constraint).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from agentloop_grpc.common.errors import FailedPreconditionError, InvalidRequestError, UnsupportedError
from agentloop_grpc.common.media import ImageError, MediaInput, check_spans, decode_image
from agentloop_grpc.common.types import SamplingParams, ServerFacts, StructuredOutput

if TYPE_CHECKING:
    from PIL.Image import Image

MAX_TOP_LOGPROBS = 20
PENALTY_BOUND = 2.0
MAX_ID_BYTES = 256
#: Session ids one EndSessions call may name: a Router ends sessions as trajectories finish, a few at a time.
MAX_END_SESSIONS = 1024
MAX_CONSTRAINT_BYTES = 64 * 1024
#: Levels of JSON arrays and objects (a schema), or of groups (a regex), a constraint may nest: vLLM refuses
#: schemas deeper than 64 itself (OpenAI allows 10 levels of schema nesting).
MAX_NESTING = 64
#: Characters of one number in a JSON schema (int64 needs 20).
MAX_NUMBER_CHARS = 100
#: Characters of an input an error message quotes at most.
QUOTE_CHARS = 64
#: Bytes of a path LoadWeights reads (Linux's PATH_MAX).
MAX_PATH_BYTES = 4096
#: Levels a safetensors header nests: name -> entry -> shape (or __metadata__ -> key -> value).
SAFETENSORS_HEADER_NESTING = 3
#: Seconds a weight group may wait to form and for each broadcast: a day, far beyond any real trainer's step.
MAX_WEIGHT_GROUP_TIMEOUT_S = 24 * 3600.0

# The catalogue. Keep one entry per rule; tests match on these texts.
END_SESSIONS_TOO_MANY = "session_ids has {count} ids; at most {bound} are allowed per call"
SESSION_ID_EMPTY = "{field} is empty; name the session_id of a trajectory that ended"
REQUEST_ID_REQUIRED = "request_id is required (a unique id per call; Abort uses it)"
ID_TOO_LONG = "{field} has {length} bytes; at most {bound} bytes are allowed (it starts {prefix})"
PROMPT_EMPTY = "prompt_ids must not be empty"
PROMPT_BOTH_FORMS = "set prompt_ids or prompt_ids_raw, not both"
PROMPT_RAW_LENGTH = "prompt_ids_raw has {length} bytes; it holds little-endian int32 ids, so a multiple of 4"
PROMPT_ID_OUT_OF_RANGE = "{field}[{index}] = {value} is outside the vocabulary [0, {vocab_size})"
PROMPT_TOO_LONG = "prompt_ids has {length} tokens; max_model_len is {max_model_len}, leaving no room to generate"
TEMPERATURE_INVALID = "sampling_params.temperature = {value} must be finite and >= 0"
TOP_P_INVALID = "sampling_params.top_p = {value} must be in (0, 1]"
TOP_K_INVALID = "sampling_params.top_k = {value} must be >= -1 (-1 or 0 disables it)"
MIN_P_INVALID = "sampling_params.min_p = {value} must be in [0, 1]"
REPETITION_PENALTY_INVALID = "sampling_params.repetition_penalty = {value} must be finite and > 0"
PENALTY_INVALID = "sampling_params.{name} = {value} must be in [-2, 2]"
MAX_NEW_TOKENS_INVALID = "sampling_params.max_new_tokens = {value} must be >= 1"
MAX_NEW_TOKENS_OVER_LIMIT = (
    "sampling_params.max_new_tokens = {value} with {prompt} prompt tokens exceeds max_model_len {max_model_len} "
    "(at most {room} new tokens fit)"
)
STOP_ID_OUT_OF_RANGE = "sampling_params.stop_token_ids[{index}] = {value} is outside the vocabulary [0, {vocab_size})"
TOP_LOGPROBS_INVALID = "sampling_params.top_logprobs = {value} must be in [0, {bound}]"
ROUTED_EXPERTS_UNSUPPORTED = (
    "sampling_params.return_routed_experts: this server cannot report routed experts ({engine} engine serving "
    "{model}; GetServerInfo's routed_expert_layers is 0)"
)
JSON_SCHEMA_INVALID = "structured_output.json_schema is not a JSON Schema: {reason}"
JSON_SCHEMA_TOO_DEEP = "structured_output.json_schema is nested more than {bound} levels deep (arrays and objects)"
JSON_SCHEMA_NUMBER_TOO_LONG = (
    "structured_output.json_schema has a number of {length} characters ({prefix}); at most {bound} are allowed"
)
REGEX_INVALID = "structured_output.regex does not compile: {reason}"
REGEX_TOO_DEEP = "structured_output.regex is nested more than {bound} levels deep (groups)"
GRAMMAR_EMPTY = "structured_output.ebnf_grammar is empty"
GRAMMAR_NO_ROOT = "structured_output.ebnf_grammar has no `root ::= ...` rule"
MIN_CHUNK_TOKENS_INVALID = "stream_options.min_chunk_tokens = {value} must be >= 0"
CONSTRAINT_TOO_LONG = "structured_output.{kind} has {length} bytes; at most {bound} bytes are allowed"
STRUCTURED_EMPTY = "structured_output is set but names no constraint (json_schema, regex or ebnf_grammar)"
# UNIMPLEMENTED, not INVALID_ARGUMENT: the request may be fine for another server
MEDIA_UNSUPPORTED = "media: this server's model takes no images"
MEDIA_TOO_MANY = "media has {count} images; at most {bound} are allowed per request (max_images_per_request)"
MEDIA_IMAGE_INVALID = "media[{index}]: {reason}"
# Checks only an engine can make (it alone knows its image token and how it expands a picture); engines raise them.
IMAGE_TOKEN_STRAY = (
    "prompt_ids[{index}] is the image token ({token}) outside every media span; an image's placeholder ids must be "
    "the span of one media item"
)
MEDIA_NOT_EXPANDED = (
    "media[{index}]: the span [{start}, {end}) is not {engine}'s expansion of this image (the ids differ from prompt "
    "position {differs}; with {engine}'s expansion the prompt has {expanded} ids, this one {length}); send the model "
    "processor's expansion of the image"
)
ENGINE_REJECTED = "{engine} rejected the request: {reason}"
PATH_TOO_LONG = "path has {length} bytes; at most {bound} bytes are allowed (it starts {prefix})"
PATH_UNREADABLE = "path {path} cannot be read: {reason}"
HEADER_TOO_DEEP = "{file} is not a safetensors file: its header nests more than {bound} levels deep"
WEIGHT_GROUP_TIMEOUT_INVALID = "timeout_s = {value} must be finite and in (0, {bound}] seconds (0: {default})"

_ROOT_RULE = re.compile(r"^\s*root\s*::=", re.MULTILINE)
# What in a regex holds parentheses that open no group: escapes, then character classes (a leading ] is literal).
_REGEX_ESCAPE = re.compile(r"\\.", re.DOTALL)
_REGEX_CLASS = re.compile(r"\[\^?\]?[^\]]*\]")


def _fail(template: str, **values: object) -> InvalidRequestError:
    return InvalidRequestError(template.format(**values))


def invalid(template: str, **values: object) -> InvalidRequestError:
    """The InvalidRequestError of one catalogue entry, for the checks only an engine can make."""
    return _fail(template, **values)


def media_unsupported() -> UnsupportedError:
    """A request with images at a server whose model takes none (UNIMPLEMENTED: another server may take them)."""
    return UnsupportedError(MEDIA_UNSUPPORTED)


def quote(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text`` as an error message shows it: its repr, cut after ``limit`` characters."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}..."


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def check_id(field: str, value: str) -> None:
    """An id (request_id, session_id, an Abort's request_ids[i]) within MAX_ID_BYTES."""
    length = _utf8_len(value)
    if length > MAX_ID_BYTES:
        raise _fail(ID_TOO_LONG, field=field, length=length, bound=MAX_ID_BYTES, prefix=quote(value))


def check_session_ids(session_ids: Sequence[str]) -> None:
    """EndSessions' ids: at most MAX_END_SESSIONS, each non-empty and within MAX_ID_BYTES."""
    if len(session_ids) > MAX_END_SESSIONS:
        raise _fail(END_SESSIONS_TOO_MANY, count=len(session_ids), bound=MAX_END_SESSIONS)
    for index, session_id in enumerate(session_ids):
        if not session_id:
            raise _fail(SESSION_ID_EMPTY, field=f"session_ids[{index}]")
        check_id(f"session_ids[{index}]", session_id)


def check_path(path: str) -> None:
    """A path the server reads (LoadWeights) within MAX_PATH_BYTES: the OS refuses longer ones."""
    length = _utf8_len(path)
    if length > MAX_PATH_BYTES:
        raise _fail(PATH_TOO_LONG, length=length, bound=MAX_PATH_BYTES, prefix=quote(path))


def unreadable_path(path: str, error: OSError) -> InvalidRequestError:
    """The error for a path the OS refuses to look at (a name too long, a folder not searchable)."""
    return _fail(PATH_UNREADABLE, path=quote(path), reason=error.strerror or error)


def check_weight_group_timeout(timeout_s: float, default_s: float) -> None:
    """JoinWeightGroup's timeout_s: 0 (the default) or a finite number of seconds up to a day (NaN compares false
    to every bound, so it is named here rather than waited on)."""
    if timeout_s == 0:
        return
    if not (0 < timeout_s <= MAX_WEIGHT_GROUP_TIMEOUT_S):
        raise _fail(WEIGHT_GROUP_TIMEOUT_INVALID, value=timeout_s, bound=MAX_WEIGHT_GROUP_TIMEOUT_S, default=default_s)


def check_request_id(request_id: str) -> None:
    if not request_id:
        raise _fail(REQUEST_ID_REQUIRED)
    check_id("request_id", request_id)


def check_prompt(prompt_ids: Sequence[int] | np.ndarray, facts: ServerFacts, field: str = "prompt_ids") -> None:
    ids = np.asarray(prompt_ids)  # int32 from the wire (PromptIds, prompt_ids_raw) or int64 from a list
    if ids.size == 0:
        raise _fail(PROMPT_EMPTY)
    if ids.dtype == np.int32:  # one reduction: as uint32, a negative id is >= 2**31, beyond any vocabulary
        out_of_range = ids.view(np.uint32).max() >= facts.vocab_size
    else:
        out_of_range = ids.min() < 0 or ids.max() >= facts.vocab_size
    if out_of_range:
        index = int(np.flatnonzero((ids < 0) | (ids >= facts.vocab_size))[0])
        raise _fail(
            PROMPT_ID_OUT_OF_RANGE, field=field, index=index, value=int(ids[index]), vocab_size=facts.vocab_size
        )
    if ids.size >= facts.max_model_len:
        raise _fail(PROMPT_TOO_LONG, length=ids.size, max_model_len=facts.max_model_len)


def check_raw_prompt(prompt_ids_raw: bytes, has_repeated: bool) -> None:
    """A prompt sent as prompt_ids_raw: the only form set, and whole int32 ids."""
    if has_repeated:
        raise _fail(PROMPT_BOTH_FORMS)
    if len(prompt_ids_raw) % 4:
        raise _fail(PROMPT_RAW_LENGTH, length=len(prompt_ids_raw))


def check_media(media: Sequence[MediaInput], prompt_len: int, facts: ServerFacts) -> None:
    """A prompt's images: a model that takes them (UnsupportedError), within the count, each one decoding within
    the bounds of ``decode_image``, their spans inside the prompt, in order. Decodes every image: CPU time the
    caller keeps off the event loop."""
    if not media:
        return
    if not facts.supports_images:
        raise UnsupportedError(MEDIA_UNSUPPORTED)
    if len(media) > facts.max_images_per_request:
        raise _fail(MEDIA_TOO_MANY, count=len(media), bound=facts.max_images_per_request)
    decoded_images(media)
    problem = check_spans(media, prompt_len)
    if problem is not None:
        raise InvalidRequestError(problem)


def decoded_images(media: Sequence[MediaInput]) -> list[Image]:
    """Each image of ``media`` decoded (CPU time: keep it off the event loop); InvalidRequestError naming
    ``media[i]`` and the bound it breaks."""
    images = []
    for index, item in enumerate(media):
        try:
            images.append(decode_image(item.data, item.mime_type))
        except ImageError as error:
            raise _fail(MEDIA_IMAGE_INVALID, index=index, reason=error) from None
    return images


def resolve_max_new_tokens(requested: int | None, prompt_len: int, facts: ServerFacts) -> int:
    """The concrete budget: the request's, else the server's default, capped by the room left under max_model_len
    (all of that room when the server has no default)."""
    room = facts.max_model_len - prompt_len
    if requested is None:
        return min(facts.default_max_new_tokens, room) if facts.default_max_new_tokens else room
    if requested < 1:
        raise _fail(MAX_NEW_TOKENS_INVALID, value=requested)
    if requested > room:
        raise _fail(
            MAX_NEW_TOKENS_OVER_LIMIT, value=requested, prompt=prompt_len, max_model_len=facts.max_model_len, room=room
        )
    return requested


def check_sampling(params: SamplingParams, facts: ServerFacts) -> None:
    if not math.isfinite(params.temperature) or params.temperature < 0:
        raise _fail(TEMPERATURE_INVALID, value=params.temperature)
    if not (0 < params.top_p <= 1):  # also rejects NaN
        raise _fail(TOP_P_INVALID, value=params.top_p)
    if params.top_k < -1:
        raise _fail(TOP_K_INVALID, value=params.top_k)
    if not (0 <= params.min_p <= 1):
        raise _fail(MIN_P_INVALID, value=params.min_p)
    if not math.isfinite(params.repetition_penalty) or params.repetition_penalty <= 0:
        raise _fail(REPETITION_PENALTY_INVALID, value=params.repetition_penalty)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(params, name)
        if not (-PENALTY_BOUND <= value <= PENALTY_BOUND):
            raise _fail(PENALTY_INVALID, name=name, value=value)
    for index, value in enumerate(params.stop_token_ids):
        if not 0 <= value < facts.vocab_size:
            raise _fail(STOP_ID_OUT_OF_RANGE, index=index, value=value, vocab_size=facts.vocab_size)
    if not (0 <= params.top_logprobs <= MAX_TOP_LOGPROBS):
        raise _fail(TOP_LOGPROBS_INVALID, value=params.top_logprobs, bound=MAX_TOP_LOGPROBS)
    if params.return_routed_experts and not facts.routed_expert_layers:
        raise FailedPreconditionError(
            ROUTED_EXPERTS_UNSUPPORTED.format(engine=facts.engine_kind, model=quote(facts.model_id, 64))
        )


def _checked_number(text: str) -> str:
    """A JSON number of a schema, kept as its text: no int conversion, so Python's digit limit never applies."""
    if len(text) > MAX_NUMBER_CHARS:
        raise _fail(JSON_SCHEMA_NUMBER_TOO_LONG, length=len(text), bound=MAX_NUMBER_CHARS, prefix=quote(text, 16))
    return text


def _json_too_deep(value: object) -> bool:
    """Whether arrays and objects nest past MAX_NESTING in a parsed JSON value (iterative: no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_NESTING:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _check_json_schema(text: str) -> None:
    try:
        schema = json.loads(text, parse_int=_checked_number, parse_float=_checked_number)
    except json.JSONDecodeError as exc:
        raise _fail(JSON_SCHEMA_INVALID, reason=f"invalid JSON ({exc})") from exc
    except RecursionError as exc:  # the decoder recurses per level: far past MAX_NESTING
        raise _fail(JSON_SCHEMA_TOO_DEEP, bound=MAX_NESTING) from exc
    if not isinstance(schema, (dict, bool)):
        raise _fail(JSON_SCHEMA_INVALID, reason=f"a schema is a JSON object or boolean, got {type(schema).__name__}")
    if _json_too_deep(schema):
        raise _fail(JSON_SCHEMA_TOO_DEEP, bound=MAX_NESTING)


def _regex_depth(pattern: str) -> int:
    """How deep groups nest in a pattern that compiles: parentheses outside escapes and character classes.

    Linear (numpy, no Python loop per character): the class pattern cannot backtrack across a compiled
    pattern's classes, each of which is closed."""
    plain = _REGEX_CLASS.sub("", _REGEX_ESCAPE.sub("x", pattern))
    codes = np.frombuffer(plain.encode(), dtype=np.uint8)
    steps = (codes == ord("(")).astype(np.int32) - (codes == ord(")"))
    return int(np.cumsum(steps).max(initial=0))


def _check_regex(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise _fail(REGEX_INVALID, reason=str(exc)) from exc
    except RecursionError as exc:  # the parser recurses per group: far past MAX_NESTING
        raise _fail(REGEX_TOO_DEEP, bound=MAX_NESTING) from exc
    if _regex_depth(pattern) > MAX_NESTING:
        raise _fail(REGEX_TOO_DEEP, bound=MAX_NESTING)


def check_structured_output(spec: StructuredOutput | None) -> None:
    """Syntax and size checks every engine shares; engines compile the constraint and may reject it further."""
    if spec is None:
        return
    length = _utf8_len(spec.spec)
    if length > MAX_CONSTRAINT_BYTES:
        raise _fail(CONSTRAINT_TOO_LONG, kind=spec.kind, length=length, bound=MAX_CONSTRAINT_BYTES)
    if spec.kind == "json_schema":
        _check_json_schema(spec.spec)
    elif spec.kind == "regex":
        _check_regex(spec.spec)
    elif spec.kind == "ebnf_grammar":
        if not spec.spec.strip():
            raise _fail(GRAMMAR_EMPTY)
        if not _ROOT_RULE.search(spec.spec):
            raise _fail(GRAMMAR_NO_ROOT)
