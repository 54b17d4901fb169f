"""JSON Schema of a typed Python function's arguments, inferred from its annotations and docstring.

Supported: str, int, float, bool, list[T], Optional[T] / T | None, Literal[...], and ``Annotated[T, {...}]`` whose
dict adds JSON Schema keywords (``pattern``, ``maxLength``, ``minimum``...: constraints the model sees and that a
grammar-constrained call obeys); a parameter with a default is not required. The docstring's first paragraph is the
description; ``Args:`` lines (Google style) describe the
parameters. Anything else is a start-up error: a schema that lies to the model is worse than none.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Collection

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


def _type_schema(annotation: typing.Any, where: str) -> dict:
    if typing.get_origin(annotation) is typing.Annotated:
        base, *metadata = typing.get_args(annotation)
        schema = _type_schema(base, where)
        for extra in metadata:
            if not isinstance(extra, dict):
                raise TypeError(f"{where}: Annotated metadata must be a dict of JSON Schema keywords")
            schema.update(extra)
        return schema
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list and len(args) == 1:
        return {"type": "array", "items": _type_schema(args[0], where)}
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in _SCALARS:
            raise TypeError(f"{where}: Literal values must share one scalar type")
        return {"type": _SCALARS[next(iter(kinds))], "enum": list(args)}
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner = _type_schema(rest[0], where)
            return {"anyOf": [inner, {"type": "null"}]}
    raise TypeError(
        f"{where}: unsupported annotation {annotation!r} (str, int, float, bool, list[T], Optional, Literal)"
    )


def _docstring(function: Callable) -> tuple[str, dict[str, str]]:
    doc = inspect.getdoc(function) or ""
    paragraphs = doc.split("\n\n")
    description = " ".join(paragraphs[0].split()) if paragraphs and not paragraphs[0].startswith("Args:") else ""
    params: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            if line.strip() and not line.startswith((" ", "\t")):
                break
            match = _ARG_LINE.match(line)
            if match:
                params[match.group(1)] = match.group(2).strip()
    return description, params


def function_schema(function: Callable, skip: Collection[str] = ()) -> tuple[str, dict]:
    """Return (description, JSON Schema of the arguments object); ``skip``: parameters the model never fills."""
    hints = typing.get_type_hints(function, include_extras=True)
    description, documented = _docstring(function)
    properties: dict[str, dict] = {}
    required: list[str] = []
    for name, parameter in inspect.signature(function).parameters.items():
        if name in skip:
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"{function.__name__}: *args/**kwargs cannot be described to a model")
        if name not in hints:
            raise TypeError(f"{function.__name__}: parameter {name!r} needs a type annotation")
        schema = _type_schema(hints[name], f"{function.__name__}({name})")
        if name in documented:
            schema["description"] = documented[name]
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
        else:
            schema["default"] = parameter.default
        properties[name] = schema
    object_schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return description, object_schema
