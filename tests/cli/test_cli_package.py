"""The CLI package runs the ``agentloop`` command the three ways it is started (``python -m agentloop_grpc.cli``,
the installed script's entry point, ``main()``), and bounds libgomp's spin-waiting when it runs, not when a module
of it is imported."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)


def test_importing_the_cli_leaves_the_environment_alone_and_running_it_bounds_the_spinning():
    result = _python(
        "import os, sys\n"
        "import agentloop_grpc.cli.commands\n"
        "print(os.environ.get('GOMP_SPINCOUNT'))\n"
        "from agentloop_grpc.cli import main\n"
        "sys.argv = ['agentloop', '--version']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(os.environ.get('GOMP_SPINCOUNT'))\n"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (lines[0], lines[-1]) == ("None", "10000")


def test_what_runs_before_main_loads_no_torch():
    # main() sets GOMP_SPINCOUNT, which libgomp reads once, when torch loads: torch must not be loaded before it
    result = _python("import sys\nimport agentloop_grpc.cli\nprint('torch' in sys.modules)\n")
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr


def test_python_dash_m_runs_the_command_group():
    result = subprocess.run([sys.executable, "-m", "agentloop_grpc.cli", "--version"], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"agentloop-grpc {importlib.metadata.version('agentloop-grpc')}"


def test_the_scripts_entry_point_is_main():
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["agentloop"]
    module, _, name = target.partition(":")
    from agentloop_grpc.cli import main

    assert getattr(importlib.import_module(module), name) is main
