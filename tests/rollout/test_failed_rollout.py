"""A rollout whose trajectories fail says why (the top error causes) and exits 3 once the failed share reaches
max_failed_share; its outputs are still written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
import yaml

from agentloop_grpc.rollout.command import EXIT_TOO_MANY_FAILED, report_failures
from agentloop_grpc.rollout.run import RunRecord

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]


def _record(*errors: str | None) -> RunRecord:
    trajectories = [SimpleNamespace(failed=e is not None, error=e) for e in errors]
    return RunRecord(output_dir=Path("out"), trajectories=trajectories)


@pytest.mark.slow
def test_all_failed_prints_causes_and_exits_3(tmp_path):
    config = {
        "engines": {"launch": {"replicas": 1, "engine": {"kind": "fake", "vocab_size": 49152}}},
        "tools": {"launch": "builtin"},
        "dataset": {"arithmetic": {"count": 2, "seed": 1}},
        "loop": {"max_prompt_tokens": 5},  # every arithmetic prompt is longer: every trajectory fails
        "output_dir": str(tmp_path / "out"),
        "report": False,
    }
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([*AGENTLOOP, "rollout", "--config", str(path)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == EXIT_TOO_MANY_FAILED, result.stderr
    assert "Traceback" not in result.stderr
    assert "error causes (2 of 2 trajectories failed" in result.stderr
    assert "more than max_prompt_tokens=5" in result.stderr
    assert "error: 2 of 2 trajectories failed (100%), max_failed_share is 1.0" in result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["failures"] == 2 and "max_prompt_tokens=5" in summary["error_causes"][0]["error"]
    assert (tmp_path / "out" / "trajectories.parquet").exists()


def test_causes_are_counted_most_common_first(capsys):
    report_failures(_record("A: x", "B: y\nmore", "B: y", None), max_failed_share=1.0)  # 3 of 4: below 1.0
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["error causes (3 of 4 trajectories failed; the Parquet `error` column has each):",
                     "  2 x B: y", "  1 x A: x"]


@pytest.mark.parametrize(("errors", "threshold", "fails"), [
    (("A", None), 0.5, True),  # the share reaching the threshold is enough
    (("A", None, None), 0.5, False),
    ((), 1.0, True),  # no trajectories at all: a failed run
    ((None,), 1.0, False),
])
def test_exit_code_follows_the_threshold(errors, threshold, fails):
    if fails:
        with pytest.raises(typer.Exit) as exit_:
            report_failures(_record(*errors), threshold)
        assert exit_.value.exit_code == EXIT_TOO_MANY_FAILED
    else:
        report_failures(_record(*errors), threshold)
