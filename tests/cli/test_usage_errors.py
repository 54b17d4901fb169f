"""Usage errors (an unknown option, a bad choice or number, a missing value or command) print as our own errors
do on every command: ``error: <message>``, then the command's help hint; exit 2, no usage block, no rich box."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentloop_grpc.cli.commands import app

runner = CliRunner()


@pytest.mark.parametrize(("args", "expected"), [
    (["engine", "serve", "--modle", "m"], "error: no such option --modle (did you mean --model?)"),
    (["engine", "serve", "--max-running", "16"], "error: no such option --max-running (did you mean --set "
                                                 "max_running=...?)"),
    (["engine", "launch", "--max_model_len", "9"], "error: no such option --max_model_len (did you mean --set "
                                                   "max_model_len=...?)"),
    (["engine", "serve", "--port", "abc"], "error: invalid value for '--port': Input should be a valid integer"),
    (["engine", "launch", "--dp", "0"], "error: invalid value for '--dp': Input should be greater than or equal to 1"),
    (["engine", "serve", "--adapter", "vlm"], "error: invalid value for '--adapter': 'vlm' is not one of"),
    (["tools", "serve"], "error: missing option '--config'"),
    (["engine", "serve", "--model"], "error: option '--model' requires an argument"),
    (["rollout", "--config"], "error: option '--config' requires an argument"),
    (["rollout", "--bogus"], "error: no such option --bogus"),
    (["train", "--bogus"], "error: no such option --bogus"),
    (["model", "prepare", "--bogus"], "error: no such option --bogus"),
])
def test_a_usage_error_is_one_error_line_and_the_help_hint(args, expected):
    result = runner.invoke(app, args, prog_name="agentloop")
    command = " ".join(["agentloop", *args[:2 if args[0] in ("engine", "tools", "model") else 1]])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[0].startswith(expected), result.output
    assert result.output.splitlines()[1:] == [f"Try '{command} --help' for help."]


def test_an_unknown_command_names_the_group_help():
    result = runner.invoke(app, ["frob"], prog_name="agentloop")
    assert result.exit_code == 2
    assert result.output.splitlines() == ["error: no such command 'frob'", "Try 'agentloop --help' for help."]


def test_the_installed_command_prints_no_box():
    """Through a real process (rich draws its boxes only where typer's own error handler runs)."""
    agentloop = str(Path(sys.executable).parent / "agentloop")
    result = subprocess.run([agentloop, "engine", "serve", "--log-level", "LOUD"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: invalid value for '--log-level': 'LOUD' is not one of 'debug', 'info', 'warning', 'error', "
        "'critical'",
        "Try 'agentloop engine serve --help' for help.",
    ]


def test_no_arguments_still_show_the_help():
    result = runner.invoke(app, ["engine"], prog_name="agentloop")
    assert "Usage: agentloop engine" in result.output and "error:" not in result.output
