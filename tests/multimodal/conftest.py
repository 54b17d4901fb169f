"""The multi-modal tests share one locally built vision-language checkpoint per session (tiny_vlm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentloop_grpc.common import model_store

from .tiny_vlm import build_tiny_vlm


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory) -> Path:
    """The folder of the tiny Idefics3 (SmolLM2 text backbone, random vision part), built once per session."""
    return build_tiny_vlm(model_store.prepare(), tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="session")
def tiny_vlm_reference(tiny_vlm):
    """(model, processor) of the tiny VLM as plain transformers runs them: what the engines are checked against."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    return (AutoModelForImageTextToText.from_pretrained(tiny_vlm, dtype=torch.float32).eval(),
            AutoProcessor.from_pretrained(tiny_vlm))
