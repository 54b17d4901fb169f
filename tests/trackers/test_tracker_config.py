"""report_to and the trackers section: the default, `none`, and bad input refused with the field and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from agentloop_grpc.rollout.config import RolloutConfig
from agentloop_grpc.trackers import TrackerError, TrackerSettings, open_trackers, resolve_report_to
from agentloop_grpc.train.config import TrainConfig

BASE = {"engines": {"addresses": ["127.0.0.1:1"]}, "dataset": {"arithmetic": {"count": 1}}}


def _rollout(**fields) -> RolloutConfig:
    return RolloutConfig.model_validate({**BASE, **fields})


def test_the_default_is_tensorboard_when_installed(monkeypatch):
    config = _rollout()
    assert config.report_to is None and resolve_report_to(config.report_to) == ("tensorboard",)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what Python does for a package that is not there
    assert resolve_report_to(config.report_to) == ()


@pytest.mark.parametrize(("report_to", "opened"),
                         [(["none"], ()), ([], ()), (["mlflow", "wandb"], ("mlflow", "wandb"))])
def test_report_to_names_what_opens(report_to, opened):
    assert resolve_report_to(_rollout(report_to=report_to).report_to) == opened


@pytest.mark.parametrize(("report_to", "message"), [
    (["tensorbord"], "Input should be 'tensorboard', 'wandb', 'mlflow' or 'none'"),
    (["none", "wandb"], "none means no tracker: give it alone"),
    (["wandb", "wandb"], "names a tracker twice"),
])
def test_bad_report_to_is_refused(report_to, message):
    for model in (RolloutConfig, TrainConfig):
        with pytest.raises(ValidationError, match="report_to") as error:
            model.model_validate({**BASE, "report_to": report_to})
        assert message in str(error.value)


@pytest.mark.parametrize(("name", "module"), [("wandb", "wandb"), ("mlflow", "mlflow"), ("mlflow", "pandas"),
                                              ("tensorboard", "tensorboard")])
def test_a_tracker_not_installed_names_its_extra(monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ValidationError) as error:
        _rollout(report_to=[name])
    assert f"{name} is not installed (no {module}): pip install 'agentloop-grpc[{name}]'" in str(error.value)


def test_the_cli_refuses_an_unknown_tracker_in_one_sentence(tmp_path: Path):
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump({**BASE, "report_to": ["mlflo"], "trackers": {"log_every": 0}}))
    result = subprocess.run([sys.executable, "-m", "agentloop_grpc.cli", "rollout", "--config", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "report_to.0" in result.stderr and "'mlflow'" in result.stderr
    assert "trackers.log_every" in result.stderr and "greater than or equal to 1" in result.stderr


def test_settings_defaults_live_under_the_output_dir(tmp_path: Path):
    settings = TrackerSettings()
    assert settings.tensorboard_dir(tmp_path) == tmp_path / "tensorboard"
    assert settings.mlflow_uri(tmp_path, {}) == (tmp_path / "mlruns").resolve().as_uri()
    assert settings.mlflow_uri(tmp_path, {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}) == "http://mlflow:5000"
    assert settings.wandb_mode({}) == "online" and settings.wandb_mode({"WANDB_MODE": "offline"}) == "offline"
    assert TrackerSettings(wandb={"mode": "disabled"}).wandb_mode({"WANDB_MODE": "offline"}) == "disabled"
    assert settings.name_of_run(tmp_path / "demo").startswith("demo-")
    with pytest.raises(ValidationError, match="run_name"):
        TrackerSettings(run_name=" ")


def test_a_tracker_that_cannot_start_ends_the_rollout_before_any_server(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump({
        "engines": {"launch": {"replicas": 1, "engine": {"kind": "fake"}}}, "dataset": {"arithmetic": {"count": 1}},
        "report_to": ["tensorboard"], "trackers": {"tensorboard": {"logdir": str(blocker / "tb")}},
        "output_dir": str(tmp_path / "out")}))
    result = subprocess.run([sys.executable, "-m", "agentloop_grpc.cli", "rollout", "--config", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "error: report_to tensorboard could not start: [Errno 20] Not a directory" in result.stderr
    assert not (tmp_path / "out" / "discovery.json").exists()  # no engine was launched


def test_wandb_online_without_a_login_is_one_sentence(tmp_path: Path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    try:
        with pytest.raises(TrackerError, match=r"report_to wandb could not start: .*wandb login"):
            open_trackers(["wandb"], TrackerSettings(), tmp_path / "out", {})
    finally:
        wandb.teardown()  # wandb keeps the settings of its first setup for the process: later tests get fresh ones
