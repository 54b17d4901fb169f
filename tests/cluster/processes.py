"""What the cluster suites run in their nodes: the CLI, the fake engine's settings, and reading a process's
announced line."""

from __future__ import annotations

import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .harness import Node

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]
#: The fake engine every server runs (the same in the single-node run the cluster's tokens are compared with).
ENGINE = {"kind": "fake", "vocab_size": 49152, "token_latency_s": 0.01}
ROOT = Path(__file__).resolve().parents[2]


def announced(process: subprocess.Popen, pattern: str, timeout_s: float, log: Path) -> re.Match:
    """The first line of ``process``'s output matching ``pattern``, read within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(max(0.0, deadline - time.monotonic())):
                line = process.stdout.readline()
                if not line:
                    break
                if match := re.search(pattern, line):
                    return match
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise AssertionError(f"no line matching {pattern!r} within {timeout_s:.0f} s (exit {process.poll()}):\n{tail}")


def stop(process: subprocess.Popen, timeout_s: float = 60) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout_s)


@dataclass(frozen=True)
class Engines:
    discovery: Path
    servers: list[dict]


@dataclass(frozen=True)
class ToolServer:
    address: str
    node: Node
