"""Every command that reads a config reports it the same way: a YAML error with its line and column, every field
pydantic refused (not only the first), a "did you mean" for a misspelt key, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from agentloop_grpc.cli.commands import app
from agentloop_grpc.common.config_errors import describe
from agentloop_grpc.rollout.config import RolloutConfig, load_config
from agentloop_grpc.tools.config import BUILTIN, ToolServerConfig
from agentloop_grpc.tools.config import load_config as load_tools

runner = CliRunner()

MISSPELT = """\
engines: {launch: {replicas: 0, engine: {kind: fake, vocab_sise: 100}}}
dataset: {arithmetic: {cont: 3}}
samples_per_promt: 2
"""


def test_every_validation_error_is_listed_with_did_you_mean(tmp_path):
    path = tmp_path / "rollout.yaml"
    path.write_text(MISSPELT)
    with pytest.raises(ValidationError) as raised:
        load_config(path)
    assert describe(path, raised.value, RolloutConfig).splitlines() == [
        f"{path}: 4 problems:",
        "  engines.launch.replicas: Input should be greater than or equal to 1",
        "  engines.launch.engine.fake.vocab_sise: Extra inputs are not permitted (did you mean vocab_size or "
        "block_size?)",
        "  dataset.arithmetic.cont: Extra inputs are not permitted (did you mean count?)",
        "  samples_per_promt: Extra inputs are not permitted (did you mean samples_per_prompt?)",
    ]


def test_a_list_entry_gets_its_own_fields_as_hints():
    with pytest.raises(ValidationError) as raised:
        ToolServerConfig.model_validate({"tools": [{"functon": "x"}]})
    assert describe("t.yaml", raised.value, ToolServerConfig) == (
        "t.yaml: tools.0.functon: Extra inputs are not permitted (did you mean function?)")


def test_a_yaml_error_keeps_line_and_column(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("engines:\n  launch: {replicas: 2\ndataset: x\n")
    with pytest.raises(yaml.YAMLError) as raised:
        load_config(path)
    assert describe(path, raised.value).startswith(f"{path}:3:8: not valid YAML: expected ',' or '}}'")


@pytest.mark.parametrize("command", [["rollout"], ["train"], ["tools", "serve"], ["engine", "serve"],
                                     ["engine", "launch"]])
def test_every_command_reports_a_broken_yaml_the_same_way(tmp_path, command):
    path = tmp_path / "broken.yaml"
    path.write_text("kind: fake\nmax_running: [1\n")
    result = runner.invoke(app, [*command, "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert f"error: {path}:3:1: not valid YAML" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("command", "what"), [(["rollout"], "a rollout config"), (["train"], "a training config"),
                                               (["tools", "serve"], "a tool server config")])
def test_a_config_that_is_not_a_mapping_is_named_as_such(tmp_path, command, what):
    path = tmp_path / "list.yaml"
    path.write_text("- kind: fake\n")
    result = runner.invoke(app, [*command, "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{what} is a YAML mapping, not a YAML list" in result.output and "Traceback" not in result.output


def test_engine_overrides_list_every_problem():
    result = runner.invoke(app, ["engine", "serve", "--adapter", "fake", "--set", "max_runing=3",
                                 "--set", "max_running=x"])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        "error: fake engine config (--set): 2 problems:",
        "  max_running: Input should be a valid integer, unable to parse string as an integer",
        "  max_runing: Extra inputs are not permitted (did you mean max_running or max_waiting?)",
    ]


def test_tools_builtin_names_the_built_in_config():
    assert {entry.function or entry.class_ for entry in load_tools(BUILTIN).tools}


def test_tools_serve_accepts_builtin():
    process = subprocess.Popen([sys.executable, "-m", "agentloop_grpc.cli", "tools", "serve", "--config", "builtin",
                                "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "agentloop tools listening on 127.0.0.1:" in process.stdout.readline()
    finally:
        process.terminate()
        process.communicate(timeout=30)
