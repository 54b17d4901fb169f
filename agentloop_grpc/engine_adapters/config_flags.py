"""An engine config on a command line: ``--set KEY=VALUE`` flags. ``agentloop engine serve`` reads them; the
launchers write them, since each server's config must reach its process (on another node, with Ray) as arguments.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel


def apply_setting(fields: dict[str, Any], setting: str) -> None:
    """Set ``KEY=VALUE`` in ``fields``; a dotted KEY reaches into a nested config (``naming.prefix=policy``).
    VALUE stays a string: the config model converts it to the field's type (``16``, ``true``, ``0.5``)."""
    key, equals, value = setting.partition("=")
    if not equals or not key:
        raise ValueError(f"{setting!r} is not KEY=VALUE")
    *parents, name = key.split(".")
    for parent in parents:
        fields = fields.setdefault(parent, {})
        if not isinstance(fields, dict):
            raise ValueError(f"{key}: {parent} is not a nested config")
    fields[name] = value


def settings(config: BaseModel) -> list[str]:
    """``KEY=VALUE`` for every field of ``config`` that differs from its default (nested ones as dotted keys);
    ``kind`` is left out (it is ``--adapter``)."""

    def flatten(values: dict[str, Any], prefix: str = "") -> list[str]:
        found = []
        for key, value in values.items():
            if isinstance(value, dict):
                found += flatten(value, f"{prefix}{key}.")
            else:
                found.append(f"{prefix}{key}={value if isinstance(value, str) else json.dumps(value)}")
        return found

    return flatten(config.model_dump(mode="json", exclude_defaults=True, exclude={"kind"}))
