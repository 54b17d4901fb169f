"""A run killed takes the servers it launched with it: `agentloop rollout` SIGKILLed or SIGTERMed while its fake
engines and tool server are up leaves no process behind (they used to outlive it, each holding its memory: a
killed benchmark's engines once pushed a later test run out of memory); a SIGTERM stops it as Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return [d for c in children for d in (c, *_descendants(c))]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_rollout_leaves_no_server_behind(tmp_path, signum):
    out = tmp_path / "out"
    config = {
        # a slow fake engine: the run is still rolling out when it is killed
        "engines": {"launch": {"replicas": 2, "engine": {"kind": "fake", "vocab_size": 49152,
                                                         "token_latency_s": 0.05}}},
        "tools": {"launch": "builtin"},
        "dataset": {"arithmetic": {"count": 8}},
        "report": False,
        "output_dir": str(out),
    }
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(config))
    errors = tmp_path / "stderr.log"
    with errors.open("w") as stderr_file:
        process = subprocess.Popen([*AGENTLOOP, "rollout", "--config", str(path)], stdout=subprocess.DEVNULL,
                                   stderr=stderr_file, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out / "discovery.json").exists():
            assert process.poll() is None, "the rollout ended before its servers were up"
            time.sleep(0.2)
        time.sleep(1.0)  # the tool server starts beside the engines
        servers = [p for p in _descendants(process.pid) if b"serve" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(servers) == 3, servers  # two engines, one tool server
        process.send_signal(signum)
        code = process.wait(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in servers):
            time.sleep(0.2)
        assert not [p for p in servers if _alive(p)]
        if signum == signal.SIGTERM:  # as Ctrl-C: the run stopped its servers and said so
            assert code == 130, errors.read_text()[-2000:]
            assert "interrupted: servers stopped" in errors.read_text()
    finally:
        for pid in [process.pid, *servers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()
