"""Reading a hostile JSON body field by field: every wrong type, unknown field or value out of bounds becomes a
GatewayError (400) whose message and ``param`` name the field by its path and say the bound."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection
from typing import Any

import jsonschema

from .exchange import GatewayError

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
#: ``where`` of a request's top level: its fields are named alone (``messages``, not ``the request.messages``).
TOP = "the request"


class Fields:
    """A JSON object read field by field; ``where`` is its path in the body (``TOP`` for the body itself)."""

    def __init__(self, value: Any, allowed: Collection[str], where: str) -> None:
        if not isinstance(value, dict):
            raise GatewayError(f"{where} must be a JSON object", param=None if where == TOP else where)
        self.value = value
        self.where = where
        for name in value:
            if name not in allowed:
                raise GatewayError(f"{self.path(name)}: unknown field (known: {', '.join(sorted(allowed))})",
                                   param=self.path(name))

    def path(self, name: str) -> str:
        return name if self.where == TOP else f"{self.where}.{name}"

    def get(self, name: str, default: Any = None) -> Any:
        return self.value.get(name, default)

    def _typed(self, name: str, types: type | tuple[type, ...], what: str, required: bool) -> Any:
        value = self.value.get(name)
        if value is None:
            if required:
                raise GatewayError(f"{self.path(name)} is required", param=self.path(name))
            return None
        allowed = types if isinstance(types, tuple) else (types,)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):  # JSON true is no 1
            raise GatewayError(f"{self.path(name)} must be {what}", param=self.path(name))
        return value

    def text(self, name: str, required: bool = False, max_chars: int | None = None) -> str | None:
        value = self._typed(name, str, "a string", required)
        if value is not None and max_chars is not None and len(value) > max_chars:
            raise GatewayError(f"{self.path(name)} has {len(value)} characters, more than {max_chars}",
                               param=self.path(name))
        return value

    def required_text(self, name: str, max_chars: int | None = None) -> str:
        value = self.text(name, True, max_chars)
        assert value is not None  # required: None raised
        return value

    def required_items(self, name: str, max_items: int | None = None) -> list[Any]:
        value = self.items(name, True, max_items)
        assert value is not None  # required: None raised
        return value

    def flag(self, name: str) -> bool:
        return bool(self._typed(name, bool, "true or false", False))

    def integer(self, name: str, low: int, high: int, required: bool = False) -> int | None:
        value = self._typed(name, int, "an integer", required)
        if value is not None and not low <= value <= high:
            raise GatewayError(f"{self.path(name)} = {value} must be in [{low}, {high}]", param=self.path(name))
        return value

    def number(self, name: str, low: float, high: float, low_open: bool = False) -> float | None:
        value = self._typed(name, (int, float), "a number", False)
        if value is None:
            return None
        value = float(value)
        if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
            bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
            raise GatewayError(f"{self.path(name)} = {value} must be in {bound}", param=self.path(name))
        return value

    def items(self, name: str, required: bool = False, max_items: int | None = None) -> list[Any] | None:
        value = self._typed(name, list, "a list", required)
        if value is None:
            return None
        if required and not value:
            raise GatewayError(f"{self.path(name)} must not be empty", param=self.path(name))
        if max_items is not None and len(value) > max_items:
            raise GatewayError(f"{self.path(name)} has {len(value)} items, more than the gateway's limit of "
                               f"{max_items}", param=self.path(name))
        return value

    def stop(self, name: str, max_items: int) -> tuple[str, ...]:
        """A stop field: a string or a list of non-empty strings."""
        value = self.value.get(name)
        if value is None:
            return ()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
            raise GatewayError(f"{self.path(name)} must be a non-empty string or a list of them",
                               param=self.path(name))
        if len(items) > max_items:
            raise GatewayError(f"{self.path(name)} has {len(items)} strings, more than {max_items}",
                               param=self.path(name))
        return tuple(items)


def check_tools(items: list[Any], where: str, function_of: Callable[[Any, str], dict[str, Any]]) -> tuple[
        dict[str, Any], ...]:
    """Tools as OpenAI function specs; ``function_of`` reads one item of the format into ``{name, description,
    parameters}``. Names must be unique and plain; parameters a JSON Schema object that compiles."""
    tools, names = [], set()
    for i, item in enumerate(items):
        path = f"{where}[{i}]"
        function = function_of(item, path)
        name = function["name"]
        if not _TOOL_NAME.match(name):
            raise GatewayError(f"{path}: the name {name[:80]!r} must be 1-64 letters, digits, '_', '.' or '-'",
                               param=path)
        if name in names:
            raise GatewayError(f"{path}: a second tool named {name!r}", param=path)
        names.add(name)
        parameters = function["parameters"]
        if not isinstance(parameters, dict):
            raise GatewayError(f"{path}: parameters must be a JSON Schema object", param=path)
        try:
            jsonschema.validators.validator_for(parameters).check_schema(parameters)
        except jsonschema.SchemaError as error:
            raise GatewayError(f"{path}: parameters is not a valid JSON Schema ({error.message})",
                               param=path) from None
        tools.append({"type": "function", "function": function})
    return tuple(tools)


def image_part(url: str, where: str) -> dict[str, Any]:
    """An image given by URL: only data URLs (the gateway fetches nothing)."""
    if not url.startswith("data:"):
        raise GatewayError(f"{where}: an image must be a data URL (data:<mime type>;base64,...); the gateway "
                           "fetches nothing", param=where)
    return {"type": "image", "image": url}
