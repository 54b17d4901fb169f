"""A request's JSON body, read within its bounds and checked once, where it is decoded, for what JSON can carry
but nothing after it can handle: a string that is not valid Unicode (a lone surrogate such as ``"\\ud800"``, which
no tokenizer or UTF-8 response can hold) and an integer longer than Python converts (4300 digits). Either is a 400
naming its path in the body (``messages[0].content``), the same path the wire formats' own checks name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request

from .exchange import GatewayError

#: Digits of the longest integer a body may hold (Python's own bound on converting text to int, fixed here so a
#: process that lifts it does not take quadratic-time bodies).
MAX_INT_DIGITS = 4300

NOT_JSON = "the body is not valid JSON ({})"
TOO_LARGE_DECLARED = "the body has {} bytes, more than max_body_bytes={}"
TOO_LARGE = "the body is more than max_body_bytes={}"
NOT_UNICODE = "{}: the text is not valid Unicode (it holds a lone surrogate)"
NOT_UNICODE_KEY = "{}: a key is not valid Unicode (it holds a lone surrogate)"
INT_TOO_LONG = "{}: the integer has {} digits, more than " + str(MAX_INT_DIGITS)
CLIENT_LEFT = "the client closed the connection before its body arrived"


#: What a body must hold for the walk to find something: an escaped surrogate, or a run of digits past the bound.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (MAX_INT_DIGITS + 1))


@dataclass(frozen=True, slots=True)
class _LongInt:
    """An integer too long to convert, kept as its length so its path can be named."""

    digits: int


def _parse_int(text: str) -> int | _LongInt:
    digits = len(text.lstrip("-"))
    return _LongInt(digits) if digits > MAX_INT_DIGITS else int(text)


async def read_json(request: Request, max_bytes: int, empty_ok: bool = False) -> Any:
    """The decoded body (None for an empty one where ``empty_ok``), or GatewayError: 413 past ``max_bytes`` (read
    no further), 400 for what is not JSON or holds a value named in the module's docstring."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise GatewayError(TOO_LARGE_DECLARED.format(declared, max_bytes), status=413, kind="too_large")
    body = bytearray()
    try:
        async for piece in request.stream():  # a chunked body is counted as it comes
            body += piece
            if len(body) > max_bytes:
                raise GatewayError(TOO_LARGE.format(max_bytes), status=413, kind="too_large")
    except ClientDisconnect:  # nobody reads the answer; it only ends the request without a traceback
        raise GatewayError(CLIENT_LEFT) from None
    if not body and empty_ok:
        return None
    try:
        value = json.loads(body, parse_int=_parse_int)
    except (ValueError, RecursionError) as error:
        raise GatewayError(NOT_JSON.format(error)) from None
    if _SURROGATE_ESCAPE.search(body) or _LONG_DIGITS.search(body):  # the walk only where it can find something
        _check_values(value)
    return value


def _check_values(value: Any) -> None:
    """GatewayError naming the first value (depth first) that the module's docstring refuses. Scalars are checked
    in place and a path is only spelled out for the value refused, so a body of millions of items costs no more
    than its containers."""
    stack: list[tuple[Any, _Path]] = [(value, None)]
    while stack:
        item, path = stack.pop()
        entries = enumerate(item) if isinstance(item, list) else item.items() if isinstance(item, dict) else ()
        if not entries:
            _check_scalar(item, path)
        children = []
        for key, child in entries:
            if isinstance(key, str) and not _is_unicode(key):
                raise GatewayError(NOT_UNICODE_KEY.format(_spelled(path)), param=_spelled(path, None))
            if isinstance(child, (list, dict)):
                children.append((child, (path, key)))
            else:
                _check_scalar(child, (path, key))
        stack.extend(reversed(children))


#: A value's place in the body: None for the body itself, else (its container's place, its key or index).
_Path = tuple[Any, str | int] | None


def _check_scalar(item: Any, path: _Path) -> None:
    if isinstance(item, str) and not _is_unicode(item):
        raise GatewayError(NOT_UNICODE.format(_spelled(path)), param=_spelled(path, None))
    if isinstance(item, _LongInt):
        raise GatewayError(INT_TOO_LONG.format(_spelled(path), item.digits), param=_spelled(path, None))


def _spelled(path: _Path, whole: str | None = "the body") -> str | None:
    """``messages[0].content``, as the wire formats name a field; ``whole`` for the body itself."""
    parts: list[str] = []
    while path is not None:
        path, key = path
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    spelled = "".join(reversed(parts)).removeprefix(".")
    return spelled or whole


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
