"""A config file: one YAML mapping, validated by its pydantic model."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel

ModelT = TypeVar("ModelT", bound=BaseModel)


def load_yaml_config(path: str | Path, model: type[ModelT], what: str) -> ModelT:
    """Read and validate the YAML at ``path`` as ``model`` (ValidationError / OSError / yaml.YAMLError on bad
    input; ValueError naming ``what`` the file should be, e.g. "a rollout config", when it holds no mapping)."""
    document = yaml.safe_load(Path(path).read_text())
    if not isinstance(document, dict):
        held = "an empty file" if document is None else f"a YAML {type(document).__name__}"
        raise ValueError(f"{what} is a YAML mapping, not {held}")
    return model.model_validate(document)
