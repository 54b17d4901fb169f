"""Helpers of the launcher tests: stop a launcher while its servers load; read a discovery file."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil


def sigterm_while_loading(args: list[str], logs: Path, timeout_s: float = 120) -> tuple[int, str, str, list[int]]:
    """Run ``agentloop engine launch`` (``args``), SIGTERM it once its first server was spawned (its log file
    exists; the server is then importing or loading, far from SERVING) and return (exit code, stdout, stderr,
    pids of the launcher's children at the signal)."""
    launcher = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not (logs / "engine-0.log").exists():
            if time.monotonic() > deadline or launcher.poll() is not None:
                raise AssertionError(f"no server was spawned: {launcher.stderr.read() if launcher.poll() else ''}")
            time.sleep(0.05)
        children = [p.pid for p in psutil.Process(launcher.pid).children()]
        time.sleep(0.5)
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=timeout_s)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return launcher.returncode, out, err, children


def discovered(path: Path) -> dict[int, str]:
    """A discovery file's servers: their address by DP rank."""
    return {s["dp_rank"]: s["address"] for s in json.loads(path.read_text())["servers"]}
