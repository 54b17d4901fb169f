"""Reading a hostile JSON body field by field, for every wire format: every wrong type or value out of bounds
becomes a GatewayError (400, ``invalid_request``) whose message and ``param`` name the field by its path and say the
bound. The rules every format shares live here once: numbers (no bool for an int, no nan, inf or integer too large
for a float), tool specs (names, uniqueness, JSON Schemas nested within a bound and compiling), images (base64 data
URLs only: the gateway fetches nothing).

A tolerant reader: the APIs grow fields every month and each client release sends some, so a field the gateway does
not know is accepted and recorded, not refused (``reading()`` collects what one request held that was ignored: the
session, a metric and the log say it). What the gateway knows and cannot honour, where ignoring it would silently
change the trajectory, is refused by name by each format."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import jsonschema
from jsonschema.validators import Draft202012Validator, validator_for

from .exchange import GatewayError

#: ``where`` of a request's top level: its fields are named alone (``messages``, not ``the request.messages``).
TOP = "the request"
#: How deeply a tool's JSON Schema may nest (real ones nest a few levels): jsonschema's check recurses several
#: frames a level, so a schema a few hundred levels deep would exhaust the stack instead of being refused.
MAX_SCHEMA_DEPTH = 64
#: Tool names: a chat template writes them into the prompt verbatim. APIs differ only in the length.
_TOOL_NAME = "[a-zA-Z0-9_.-]"
_DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,", re.ASCII)
#: What the request being read held that the gateway ignored (None: no request is being read).
_IGNORED: ContextVar[list[str] | None] = ContextVar("agentloop_gateway_ignored", default=None)
#: An ignored field's name as recorded: a client's key may be anything, and names become metric labels.
MAX_IGNORED_NAME = 80
_INDEX = re.compile(r"\[\d+\]")
_UNPRINTABLE = re.compile(r"[^A-Za-z0-9_.\-\[\]=:/]")


@contextmanager
def reading() -> Iterator[list[str]]:
    """The names of what the request read in this block held and the gateway ignored (``ignore``), in order,
    each once."""
    names: list[str] = []
    token = _IGNORED.set(names)
    try:
        yield names
    finally:
        _IGNORED.reset(token)


def ignore(path: str) -> None:
    """Record that the request's field at ``path`` was accepted and ignored; list indices are dropped from the
    name (``tools[4].type=web_search`` is ``tools[].type=web_search``), so a name says what, not where."""
    names = _IGNORED.get()
    if names is None:
        return
    name = _UNPRINTABLE.sub("?", _INDEX.sub("[]", path))[:MAX_IGNORED_NAME]
    if name not in names:
        names.append(name)


def json_type(value: Any) -> str:
    """A JSON value's type as a client would name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def shown(value: Any) -> str:
    """A client's value in a message, cut short (a hostile one may be huge)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def refuse(message: str, param: str | None) -> GatewayError:
    """The 400 for a request field; ``raise refuse(...)``."""
    return GatewayError(message, status=400, kind="invalid_request", param=param)


def text_value(value: Any, where: str, nonempty: bool = False) -> str:
    """A string found in a list (a field of an object is read with ``Fields.text``)."""
    if not isinstance(value, str):
        raise refuse(f"{where} must be a string, not {json_type(value)}", where)
    if nonempty and not value:
        raise refuse(f"{where} must not be empty", where)
    return value


def _bounds(low: float, high: float, low_open: bool = False) -> str:
    return f"{'(' if low_open else '['}{low:g}, {high:g}]"


class Fields:
    """A JSON object read field by field; ``where`` is its path in the body (``TOP`` for the body itself).

    ``allowed``: the fields the gateway reads (any other is accepted and recorded as ignored), or None where the
    object may carry fields that are no news (an item a client echoes back from a response, with ids and statuses
    meaning nothing as input: not recorded)."""

    def __init__(self, value: Any, allowed: Collection[str] | None, where: str) -> None:
        if not isinstance(value, dict):
            if where == TOP:
                raise refuse(f"the request body must be a JSON object, not {json_type(value)}", None)
            raise refuse(f"{where} must be an object, not {json_type(value)}", where)
        self.value = value
        self.where = where
        if allowed is not None:
            for name in value:
                if name not in allowed:
                    ignore(self.path(str(name)))

    def path(self, name: str) -> str:
        return name if self.where == TOP else f"{self.where}.{name}"

    def get(self, name: str, default: Any = None) -> Any:
        return self.value.get(name, default)

    def _typed(self, name: str, types: type | tuple[type, ...], what: str, required: bool) -> Any:
        value = self.value.get(name)
        if value is None:
            if required:
                raise refuse(f"{self.path(name)} is required ({what})", self.path(name))
            return None
        allowed = types if isinstance(types, tuple) else (types,)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):  # JSON true is no 1
            raise refuse(f"{self.path(name)} must be {what}, not {json_type(value)}", self.path(name))
        return value

    def text(self, name: str, required: bool = False, max_chars: int | None = None,
             nonempty: bool = False) -> str | None:
        value = self._typed(name, str, "a string", required)
        if value is not None and max_chars is not None and len(value) > max_chars:
            raise refuse(f"{self.path(name)} has {len(value)} characters, more than {max_chars}", self.path(name))
        if value == "" and nonempty:
            raise refuse(f"{self.path(name)} must not be empty", self.path(name))
        return value

    def required_text(self, name: str, max_chars: int | None = None, nonempty: bool = False) -> str:
        value = self.text(name, True, max_chars, nonempty)
        assert value is not None  # required: None raised
        return value

    def one_of(self, name: str, options: Collection[str], required: bool = False) -> str | None:
        """A string naming one of ``options``."""
        value = self.value.get(name)
        choices = list(options)
        alternatives = f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]
        if value is None and required:
            raise refuse(f"{self.path(name)} is required ({alternatives})", self.path(name))
        if value is not None and (not isinstance(value, str) or value not in choices):
            raise refuse(f"{self.path(name)} must be {alternatives}, not {shown(value)}", self.path(name))
        return value

    def flag(self, name: str) -> bool:
        return bool(self._typed(name, bool, "a boolean (true or false)", False))

    def mapping(self, name: str, required: bool = False) -> dict[str, Any] | None:
        return self._typed(name, dict, "an object", required)

    def integer(self, name: str, low: int, high: int, required: bool = False,
                bound: str | None = None) -> int | None:
        """An integer in [low, high]; ``bound`` names where a bound comes from (a gateway limit)."""
        value = self._typed(name, int, "an integer", required)
        if value is not None and not low <= value <= high:
            source = f" (the gateway's {bound})" if bound else ""
            raise refuse(f"{self.path(name)} = {shown(value)} must be in [{low}, {high}]{source}", self.path(name))
        return value

    def required_integer(self, name: str, low: int, high: int) -> int:
        value = self.integer(name, low, high, True)
        assert value is not None  # required: None raised
        return value

    def number(self, name: str, low: float, high: float, low_open: bool = False) -> float | None:
        """A finite number in [low, high] (or (low, high]): nan, inf and an integer too large for a float are
        out of bounds."""
        value = self._typed(name, (int, float), "a number", False)
        if value is None:
            return None
        try:
            number = float(value)
        except OverflowError:  # a JSON integer beyond any float
            number = math.inf
        if not math.isfinite(number) or number > high or number < low or (low_open and number == low):
            raise refuse(f"{self.path(name)} must be a finite number in {_bounds(low, high, low_open)}, "
                         f"not {shown(value)}", self.path(name))
        return number

    def items(self, name: str, required: bool = False, max_items: int | None = None,
              bound: str | None = None) -> list[Any] | None:
        """A list; ``bound`` names the gateway limit ``max_items`` is."""
        value = self._typed(name, list, "a list (a JSON array)", required)
        if value is None:
            return None
        if required and not value:
            raise refuse(f"{self.path(name)} is empty: it must hold at least one item", self.path(name))
        if max_items is not None:
            check_count(len(value), max_items, self.path(name), "items", bound)
        return value

    def required_items(self, name: str, max_items: int | None = None, bound: str | None = None) -> list[Any]:
        value = self.items(name, True, max_items, bound)
        assert value is not None  # required: None raised
        return value

    def strings(self, name: str, max_items: int, bound: str | None = None) -> tuple[str, ...]:
        """A list of non-empty strings."""
        items = self._typed(name, list, "a list of strings (a JSON array)", False) or []
        check_count(len(items), max_items, self.path(name), "strings", bound)
        return tuple(text_value(s, f"{self.path(name)}[{i}]", nonempty=True) for i, s in enumerate(items))

    def stop(self, name: str, max_items: int) -> tuple[str, ...]:
        """A stop field: a string or a list of non-empty strings."""
        value = self.value.get(name)
        if value is None:
            return ()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
            raise refuse(f"{self.path(name)} must be a non-empty string or a list of them", self.path(name))
        check_count(len(items), max_items, self.path(name), "strings", None)
        return tuple(items)


def check_count(count: int, limit: int, where: str, what: str, bound: str | None) -> None:
    """A gateway limit on how many things a request holds; ``bound``: the limit's name in GatewayLimits."""
    if count > limit:
        source = f" ({bound})" if bound else ""
        raise refuse(f"{where} holds {count} {what}, more than the gateway's limit of {limit}{source}", where)


def depth(value: Any) -> int:
    """How deeply a JSON value nests (a scalar: 0), without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level + 1)
            stack.extend((child, level + 1) for child in children)
    return deepest


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """A tool's parameters: a JSON Schema object, nested at most MAX_SCHEMA_DEPTH levels, that compiles."""
    if not isinstance(schema, dict):
        raise refuse(f"{where} must be a JSON Schema object, not {json_type(schema)}", where)
    if depth(schema) > MAX_SCHEMA_DEPTH:
        raise refuse(f"{where} nests deeper than {MAX_SCHEMA_DEPTH} levels", where)
    if not isinstance(schema.get("$schema", ""), str):
        raise refuse(f"{where}.$schema must be a string, not {json_type(schema['$schema'])}", f"{where}.$schema")
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError, RecursionError):  # not JSON after all (a client's body always is)
        key = None
    problem = _schema_problem(key) if key is not None else _check_schema(schema)
    if problem is not None:
        raise refuse(f"{where} {problem}", where)
    return schema


@functools.lru_cache(maxsize=1024)
def _schema_problem(text: str) -> str | None:
    """``_check_schema`` of a schema as JSON text: an agent offers the same tools every turn, and checking a schema
    against its metaschema costs more than the rest of reading a turn (measured in bench/coding_agents.py)."""
    return _check_schema(json.loads(text))


def _check_schema(schema: dict[str, Any]) -> str | None:
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as error:
        return f"is not a valid JSON Schema ({error.message[:200]})"
    except RecursionError:  # a reference cycle or nesting the depth bound did not see
        return "is nested too deeply to check"
    return None


def hosted_tool(kind: Any, where: str) -> None:
    """A tool of a type the model cannot call through the gateway (web search, a namespace of another client's
    tools, computer use, a server tool): left out of what the model sees and recorded, never an error, since a
    client offers such tools by default and its model may do without them."""
    ignore(f"{where}.type={kind if isinstance(kind, str) else json_type(kind)}")


def check_tools(items: list[Any], where: str, function_of: Callable[[Any, str], dict[str, Any] | None], *,
                name_at: str = "function.name", schema_at: str = "function.parameters",
                max_name: int = 64) -> tuple[dict[str, Any], ...]:
    """Tools as OpenAI function specs; ``function_of`` reads one item of the format into ``{name, description?,
    parameters?}``, or None for a hosted tool it left out (``hosted_tool``); ``name_at`` and ``schema_at`` say
    where the format keeps those in an item (for the error's path). Names must be unique, 1 to ``max_name``
    letters, digits, '_', '.' or '-'; parameters a JSON Schema."""
    tools, names = [], set()
    pattern = re.compile(f"{_TOOL_NAME}{{1,{max_name}}}")
    for i, item in enumerate(items):
        path = f"{where}[{i}]"
        function = function_of(item, path)
        if function is None:
            continue
        name = function["name"]
        if not pattern.fullmatch(name):
            raise refuse(f"{path}.{name_at} {shown(name)} must be 1-{max_name} letters, digits, '_', '.' or '-' "
                         f"(^{_TOOL_NAME}{{1,{max_name}}}$)", f"{path}.{name_at}")
        if name in names:
            raise refuse(f"{path}.{name_at} {name!r} is offered twice", f"{path}.{name_at}")
        names.add(name)
        if "parameters" in function:
            check_schema(function["parameters"], f"{path}.{schema_at}")
        tools.append({"type": "function", "function": function})
    return tuple(tools)


def image_part(url: str, where: str) -> dict[str, Any]:
    """An image given by URL: only base64 data URLs of an image type (the gateway fetches nothing)."""
    if not _DATA_URL.match(url):
        raise refuse(f"{where}: an image must be a data URL (data:image/<type>;base64,...); the gateway has no "
                     f"network and fetches nothing, not {shown(url[:40])}", where)
    try:
        base64.b64decode(url[url.index(",") + 1:], validate=True)
    except (binascii.Error, ValueError) as error:
        raise refuse(f"{where}: the image's base64 data is not valid ({error})", where) from None
    return {"type": "image", "image": url}
