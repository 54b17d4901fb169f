"""One error style for every command that reads a YAML config: the file, then each problem on its own line.

A YAML syntax error keeps its line and column (``FILE:LINE:COLUMN: problem``); a validation error lists every field
pydantic refused, not only the first, and an unknown key gets the closest field names of its section as a "did you
mean". Loaders keep raising ``yaml.YAMLError`` and ``pydantic.ValidationError``; commands turn them into text here.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError


def describe(path: str | Path, error: ValidationError | yaml.YAMLError, model: type[BaseModel] | None = None) -> str:
    """The message of ``error`` raised while loading ``path`` (several lines when several fields are wrong);
    ``model`` is the config's class, whose field names the "did you mean" hints come from."""
    if isinstance(error, yaml.YAMLError):
        return _yaml_message(path, error)
    problems = [_problem(detail, model) for detail in error.errors()]
    if len(problems) == 1:
        return f"{path}: {problems[0]}"
    return "\n  ".join([f"{path}: {len(problems)} problems:", *problems])


def _yaml_message(path: str | Path, error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)  # marks count from 0
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def _problem(detail: Mapping[str, Any], model: type[BaseModel] | None) -> str:
    loc = tuple(detail["loc"])
    where = ".".join(str(part) for part in loc) or "(top level)"
    message = detail["msg"].removeprefix("Value error, ")
    if detail["type"] == "extra_forbidden" and model is not None and loc:
        close = difflib.get_close_matches(str(loc[-1]), sorted(_fields_at(model, loc[:-1])), n=3)
        if close:
            message += f" (did you mean {' or '.join(close)}?)"
    return f"{where}: {message}"


def _fields_at(model: type[BaseModel], loc: Iterable[Any]) -> set[str]:
    """The field names (and aliases) of the section at ``loc`` inside ``model`` (empty when it is not a model)."""
    candidates: list[Any] = [model]
    for part in loc:
        stepped = [inner for kind in candidates for inner in _step(kind, part)]
        if stepped:
            candidates = stepped
        else:  # a union member's tag (pydantic puts it in the location): keep the members that carry it
            tagged = [kind for kind in candidates if _tag(kind) == part]
            candidates = tagged or candidates
    names: set[str] = set()
    for kind in candidates:
        for name, info in getattr(kind, "model_fields", {}).items():
            names.add(info.alias or name)
    return names


def _step(kind: Any, part: Any) -> list[Any]:
    """The models one location part leads to from ``kind`` (a field, a list index or a dict key)."""
    if isinstance(kind, _Element):
        return [kind.model]
    if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
        return []
    for name, info in kind.model_fields.items():
        if part in (name, info.alias):
            return _containers(info.annotation)
    return []


def _containers(annotation: Any) -> list[Any]:
    """A field's models, directly or inside a union; a list, tuple or dict of them waits for its index or key."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _containers(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [model for arg in typing.get_args(annotation) for model in _containers(arg)]
    if origin in (list, tuple, dict):
        return [_Element(model) for model in _containers(typing.get_args(annotation)[-1])]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


class _Element:
    """A list index or dict key still to come before the element model (the next part is consumed by it)."""

    def __init__(self, model: Any) -> None:
        self.model = model


def _tag(kind: Any) -> Any:
    field = getattr(kind, "model_fields", {}).get("kind")
    return field.default if field is not None else None


def returned_model(loader: Callable[..., Any]) -> type[BaseModel] | None:
    """The config class a loader is annotated to return (where the "did you mean" names come from), if any."""
    try:
        kind = typing.get_type_hints(loader).get("return")
    except (NameError, TypeError):  # an annotation that does not resolve: no hints, the errors are still listed
        return None
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None
