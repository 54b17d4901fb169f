"""The configuration reference is generated from the code; the committed file must match it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_rollout_config_reference_is_current():
    result = subprocess.run([sys.executable, "docs/generate_config_reference.py", "--check"], cwd=ROOT)
    assert result.returncode == 0, "docs/rollout-config.md is stale: run python docs/generate_config_reference.py"


def test_demo_config_is_valid():
    from agentloop_grpc.rollout.config import load_config

    config = load_config(ROOT / "examples" / "demo.yaml")
    assert config.engines.launch.replicas == 2 and config.loop.constrain_tool_calls
