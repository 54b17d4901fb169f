"""The configuration reference is generated from the code; the committed file must match it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_config_references_are_current():
    result = subprocess.run([sys.executable, "docs/generate_config_reference.py", "--check"], cwd=ROOT)
    assert result.returncode == 0, "docs/*-config.md are stale: run python docs/generate_config_reference.py"


def test_demo_config_is_valid():
    from agentloop_grpc.rollout.config import load_config

    config = load_config(ROOT / "examples" / "demo.yaml")
    assert config.engines.launch.replicas == 2 and config.loop.constrain_tool_calls


def test_train_config_is_valid():
    from agentloop_grpc.train.config import load_train_config

    config = load_train_config(ROOT / "examples" / "train.yaml")
    assert config.engines.launch.replicas == 2 and config.dataset.arithmetic.kind == "one_step"
    assert config.loop.constrain_tool_calls and config.loop.sampling.temperature > 0
