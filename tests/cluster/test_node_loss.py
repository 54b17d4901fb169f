"""Engine nodes lost and addresses advertised, on the shared cluster of tests/cluster/conftest.py: a launcher of
this module's own on node4/node5 (the shared engines on node1/node2 are only used as the other server, never
touched), drivers in node0."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import pki
from .harness import Cluster, Node, namespace_pids, skip_reason
from .processes import AGENTLOOP, ENGINE, ROOT, Engines, announced, stop

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]

_SETTINGS = [arg for key, value in ENGINE.items() if key != "kind" for arg in ("--set", f"{key}={value}")]


def _power_off(node: Node) -> None:
    """Every process of ``node`` SIGKILLed at once, as a node that loses power or is preempted: its raylet gets
    no chance to tell the GCS (a SIGTERM would: Ray's graceful shutdown unregisters the node)."""
    deadline = time.monotonic() + 10
    while pids := namespace_pids(node.namespace):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert time.monotonic() < deadline, f"{pids} survived SIGKILL"
        time.sleep(0.02)


def _wait_for_line(path: Path, pattern: str, timeout_s: float) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if match := re.search(pattern, path.read_text(errors="replace")):
            return match
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r} in {path} within {timeout_s:.0f} s:\n"
                         f"{path.read_text(errors='replace')[-3000:]}")


@pytest.mark.fault
def test_a_killed_engine_node_is_reported_its_work_resumes_and_its_server_restarts_on_a_spare(
    cluster: Cluster, engines: Engines, certificates: pki.ClusterPki, cluster_timings: dict[str, float],
    tmp_path: Path,
) -> None:
    """One server launched with --restart-lost on node4 or node5 (the other is the spare), six generations of 600
    tokens over it and a shared engine; its node powered off 1 s in. Its generations resume on the shared engine,
    every one complete and token-exact; the launcher logs the loss (server, node, cause), restarts the server on the
    spare node and rewrites the discovery file, and the driver's Router, following the file, routes to it."""
    discovery, log = tmp_path / "discovery.json", tmp_path / "launch.log"
    launcher = cluster.head.spawn(
        [*AGENTLOOP, "engine", "launch", "--ray", "--ray-address", cluster.ray_address, "--adapter", "fake",
         *_SETTINGS, "--dp", "1", "--cpus-per-server", "1", "--resources-per-server", '{"loss_engine": 1}',
         "--restart-lost", "--discovery-file", str(discovery), "--log-dir", str(tmp_path / "logs"),
         "--tls-cert", str(certificates.server_cert), "--tls-key", str(certificates.server_key),
         "--tls-ca", str(certificates.ca), "--auth-token-file", str(certificates.token),
         "--admin-token-file", str(certificates.admin_token), "--log-level", "WARNING"],
        log=log, stdout=subprocess.PIPE,
    )
    driver = None
    try:
        announced(launcher, r"1 fake server\(s\) serving over Ray placement groups", 90, log)
        (server,) = json.loads(discovery.read_text())["servers"]
        doomed = next(n for n in cluster.nodes if n.address == server["node_ip"])
        spare = next(n for n in cluster.nodes[4:6] if n is not doomed)
        assert doomed in cluster.nodes[4:6]
        other = engines.servers[1]["address"]  # node2's shared engine: only generates here
        sessions, tokens, driver_log = 6, 600, tmp_path / "driver.log"
        driver = cluster.head.spawn(
            [sys.executable, "-m", "tests.cluster.node_loss_driver", str(discovery), other, str(sessions), str(tokens),
             str(ENGINE["vocab_size"])],
            log=driver_log, env={"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stdin=subprocess.PIPE,
        )
        placed = json.loads(announced(driver, r"^streaming (.*)", 60, driver_log).group(1))
        on_doomed = {s for s, address in placed.items() if address == server["address"]}
        assert on_doomed and set(placed.values()) == {server["address"], other}
        time.sleep(1)
        at, began = time.time(), time.monotonic()
        _power_off(doomed)
        driver.stdin.write(f"killed {at}\n")
        driver.stdin.flush()
        lost = _wait_for_line(log, r"ERROR .*engine server (\S+) \(dp rank 0\) on node (\S+) .* lost: (.*)", 60)
        reported = time.monotonic() - began
        restarted = _wait_for_line(log, r"engine server dp rank 0 restarted on node (\S+) at (\S+),", 90)
        back = time.monotonic() - began
        done = json.loads(announced(driver, r"^done (.*)", 60, driver_log).group(1))
        rejoined = json.loads(announced(driver, r"^rejoined (.*)", 60, driver_log).group(1))
        assert driver.wait(30) == 0
        now = json.loads(discovery.read_text())["servers"]
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
            driver.wait()
        code = stop(launcher)
    assert code == 0, log.read_text(errors="replace")[-3000:]
    # the launcher: the loss named (server, node, cause), the server restarted on the spare, the file rewritten
    assert lost.groups()[:2] == (server["address"], doomed.address)
    assert lost.group(3).startswith("its node died"), lost.group(3)
    assert restarted.group(1) == spare.address and restarted.group(2).startswith(spare.address + ":")
    assert [(s["address"], s["node_ip"], s["dp_rank"]) for s in now] == [(restarted.group(2), spare.address, 0)]
    assert now[0]["placement_group"] == server["placement_group"]  # Ray moved the group to the spare
    # nothing lost: every generation complete; the killed node's resumed on the other server, token-exact
    assert done["tokens"] == dict.fromkeys(placed, tokens)
    assert {s: tuple(v) for s, v in done["servers"].items()} == {
        s: (server["address"], other) if s in on_doomed else (other,) for s in placed
    }
    assert all(0 < done["cut_at"][s] < tokens for s in on_doomed)
    assert all(done["cut_at"][s] == tokens for s in placed.keys() - on_doomed)
    # the driver's Router took the restarted server up from the file, dropped the dead one, and routes to it
    assert rejoined["address"] == restarted.group(2) and rejoined["new_session_on_it"] is not None
    assert rejoined["fleet"] == sorted([other, restarted.group(2)])
    cluster_timings["node killed: server taken out by the Router after"] = done["detected_s"]
    cluster_timings["node killed: last generation resumed after"] = max(done["resumed_s"].values())
    cluster_timings["node killed: loss reported by the launcher after"] = reported
    cluster_timings["node killed: server restarted on the spare after"] = back
    cluster_timings["node killed: restarted server routed to after"] = rejoined["routed_s"]
    assert done["detected_s"] is not None and done["detected_s"] <= 10 + 1.5  # a reset, or the keepalive bound
    assert reported <= 5 * (1 + 1) + 5  # the GCS's 5 failed checks 1 s apart, with a loaded machine's margin


def test_a_server_bound_to_all_interfaces_is_reached_by_its_node_address(cluster: Cluster, tmp_path: Path) -> None:
    """`engine launch --host 0.0.0.0` in node3 (no Ray): the discovery file names node3's address (the node has no
    default route: its interface's), which a Router in node0 dials."""
    node, discovery, log = cluster.nodes[3], tmp_path / "discovery.json", tmp_path / "launch.log"
    launcher = node.spawn(
        [*AGENTLOOP, "engine", "launch", "--host", "0.0.0.0", "--adapter", "fake", *_SETTINGS, "--dp", "1",
         "--discovery-file", str(discovery), "--log-dir", str(tmp_path / "logs"), "--log-level", "ERROR"],
        log=log, stdout=subprocess.PIPE,
    )
    try:
        announced(launcher, r"1 fake server\(s\) serving", 60, log)
        (server,) = json.loads(discovery.read_text())["servers"]
        assert server["address"].startswith(node.address + ":")
        generated = cluster.head.run([sys.executable, "-c", _GENERATE, str(discovery)], timeout=60)
        assert generated.returncode == 0 and generated.stdout.split() == [server["address"], "4"], generated.stderr
    finally:
        assert stop(launcher) == 0, log.read_text(errors="replace")[-3000:]


_GENERATE = """
import asyncio, sys
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.router import GenerateCall, Router

async def main(path):
    async with Router.from_discovery_file(path) as router:
        result = await router.generate(GenerateCall("s", [1, 2, 3], SamplingParams(max_new_tokens=4)))
        print(*result.servers, len(result.token_ids))

asyncio.run(main(sys.argv[1]))
"""
