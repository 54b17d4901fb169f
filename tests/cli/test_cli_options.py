"""Options every command shares: --version, and --log-level limited to Python's levels (any case)."""

from __future__ import annotations

import importlib.metadata

import pytest
from typer.testing import CliRunner

from agentloop_grpc.cli.commands import app

runner = CliRunner(env={"COLUMNS": "300"})  # usage errors are boxed by rich: one line each


def test_version_prints_the_installed_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"agentloop-grpc {importlib.metadata.version('agentloop-grpc')}"


@pytest.mark.parametrize("command", [["engine", "serve"], ["tools", "serve", "--config", "pyproject.toml"]])
def test_unknown_log_level_is_a_usage_error_listing_the_levels(command):
    result = runner.invoke(app, [*command, "--log-level", "LOUD"])
    assert result.exit_code == 2
    assert "'LOUD' is not one of" in result.output and "'warning'" in result.output
