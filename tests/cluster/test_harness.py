"""The cluster harness without Ray (seconds, not minutes): nodes reach each other by address and nothing else
reaches them; a partition cuts a node off and a heal brings it back; a run stopped by SIGTERM leaves nothing, and
what a SIGKILLed run leaves is removed at the next start."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .harness import PREFIX, Cluster, NodeSpec, namespace_pids, remove_stale, skip_reason

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]

ROOT = Path(__file__).resolve().parents[2]

# a TCP server in a node: accepts, writes "ok", closes; prints its port once bound
_SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen()
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"ok"); c.close()
"""

# a client in a node: prints what the server at argv[1]:argv[2] sends, or the error, within argv[3] seconds
_CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
        print(c.recv(2).decode())
except OSError as e:
    print(type(e).__name__)
"""


def _reach(node, address: str, port: int, timeout_s: float = 1.0) -> str:
    return node.run([sys.executable, "-c", _CLIENT, address, str(port), str(timeout_s)], timeout=30).stdout.strip()


def test_nodes_reach_each_other_by_address_and_a_partition_cuts_one_off() -> None:
    with Cluster([NodeSpec(ray=False), NodeSpec(ray=False)]) as cluster:
        node0, node1 = cluster.nodes
        server = node1.spawn([sys.executable, "-c", _SERVER, node1.address], stdout=subprocess.PIPE)
        port = int(server.stdout.readline())
        assert _reach(node0, node1.address, port) == "ok"
        with socket.socket() as probe:  # the bridge has no address: this machine's own stack has no route there
            probe.settimeout(1)
            assert probe.connect_ex((node1.address, port)) != 0
        cluster.partition(node1)
        began = time.monotonic()
        assert _reach(node0, node1.address, port) in {"TimeoutError", "OSError"}
        assert time.monotonic() - began >= 0.9  # lost packets, not a refusal
        cluster.heal(node1)
        for _ in range(50):  # the link's carrier comes back within a few hundred ms
            if _reach(node0, node1.address, port) == "ok":
                break
            time.sleep(0.1)
        else:
            raise AssertionError("node1 did not come back after heal")
    assert cluster.leftovers() == []
    assert server.poll() is not None


_RUN = """
import sys, time
from tests.cluster.harness import Cluster, NodeSpec
cluster = Cluster([NodeSpec(ray=False), NodeSpec(ray=False)])
cluster.start()
sleeper = cluster.nodes[1].spawn(["sleep", "600"])
print(" ".join(n.namespace for n in cluster.nodes), sleeper.pid, flush=True)
time.sleep(600)
"""


def _started_run() -> tuple[subprocess.Popen, list[str], int]:
    run = subprocess.Popen([sys.executable, "-c", _RUN], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    *namespaces, sleeper = run.stdout.readline().split()
    assert all(Path("/run/netns", n).exists() for n in namespaces)
    return run, namespaces, int(sleeper)


def _links_of(pid: int) -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line.split(":")[1].strip() for line in out.splitlines() if f" {PREFIX}{pid}" in line]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # a zombie nobody reaped yet is dead too


def test_a_run_stopped_by_sigterm_leaves_nothing() -> None:
    run, namespaces, sleeper = _started_run()
    run.send_signal(signal.SIGTERM)
    assert run.wait(30) == -signal.SIGTERM  # it still dies of the signal, after cleaning up
    assert not any(Path("/run/netns", n).exists() for n in namespaces)
    assert _gone(sleeper) and _links_of(run.pid) == []
    assert not Path(f"/tmp/{PREFIX}{run.pid}").exists()


def test_what_a_killed_run_left_is_removed_at_the_next_start() -> None:
    run, namespaces, sleeper = _started_run()
    run.kill()
    run.wait(30)
    assert all(Path("/run/netns", n).exists() for n in namespaces) and not _gone(sleeper)
    assert namespace_pids(namespaces[1]) == [sleeper]
    removed = remove_stale()
    assert set(namespaces) <= set(removed)
    assert not any(Path("/run/netns", n).exists() for n in namespaces)
    for _ in range(50):
        if _gone(sleeper):
            break
        time.sleep(0.1)
    assert _gone(sleeper)
    assert _links_of(run.pid) == [] and not Path(f"/tmp/{PREFIX}{run.pid}").exists()
