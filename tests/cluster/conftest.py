"""What the cluster suites share: one cluster for the whole run, with its certificates, two engine servers launched
over Ray and a tool server, and the timings the fixtures record, printed at the end of the run (how long a cluster
takes to come up and to go, what a fault took to detect).

    node0 10.238.0.1  Ray head (no CPUs for Ray): `agentloop engine launch --ray` and `agentloop rollout`
    node1 10.238.0.2  Ray worker, 1 CPU: one engine server (a DP group's placement group)
    node2 10.238.0.3  Ray worker, 1 CPU: the other engine server
    node3 10.238.0.4  no Ray: the tool server
    node4 10.238.0.5  Ray worker, 1 CPU, for tests that launch engines of their own (``loss_engine`` resource)
    node5 10.238.0.6  Ray worker, 1 CPU, the same: a node to kill and a spare one to restart on

The shared engines reserve the ``shared_engine`` resource, which only node1 and node2 have, so they never land on
node4 or node5. The GCS checks every raylet each second and declares its node dead after 5 failed checks: a killed
node (its raylet's port refused) is dead ~5 s later, a partitioned one (each check waits out its 10 s timeout)
~55 s later, longer than any partition here lasts.

Every server needs TLS (a certificate naming the nodes' IPs, made here) and tokens; drivers in node0 find the
engines through the launcher's discovery file.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from . import pki
from .harness import Cluster, NodeSpec
from .processes import AGENTLOOP, ENGINE, Engines, ToolServer, announced, stop

_TIMINGS = pytest.StashKey[dict[str, float]]()
#: What the shared engines' placement groups reserve besides a CPU: only node1 and node2 have it.
SHARED = {"shared_engine": 1}
#: The GCS's health checks of the raylets (Ray's defaults: every 3 s, 5 failures).
RAY_NODE_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "10000",
                  "RAY_health_check_failure_threshold": "5"}


@pytest.fixture(scope="session")
def cluster_timings(pytestconfig: pytest.Config) -> dict[str, float]:
    """Seconds by name; the terminal summary lists them."""
    return pytestconfig.stash.setdefault(_TIMINGS, {})


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    timings = config.stash.get(_TIMINGS, {})
    if timings:
        terminalreporter.write_sep("-", "cluster timings (s)")
        for name, seconds in timings.items():
            terminalreporter.write_line(f"{name}: {seconds:.2f}")


@pytest.fixture(scope="session")
def cluster(cluster_timings: dict[str, float]) -> Iterator[Cluster]:
    began = time.monotonic()
    shared, own = NodeSpec(num_cpus=1, resources=SHARED), NodeSpec(num_cpus=1, resources={"loss_engine": 1})
    specs = [NodeSpec(num_cpus=0), shared, shared, NodeSpec(ray=False), own, own]
    cluster = Cluster(specs)
    cluster.env.update(RAY_NODE_DEATH)
    with cluster:
        cluster_timings["cluster up"] = time.monotonic() - began
        cluster_timings.update({f"  {phase}": seconds for phase, seconds in cluster.timings.items()})
        yield cluster
        began = time.monotonic()
    cluster_timings["cluster down"] = time.monotonic() - began
    assert cluster.leftovers() == []


@pytest.fixture(scope="session")
def certificates(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> pki.ClusterPki:
    return pki.issue(tmp_path_factory.mktemp("pki"), [node.address for node in cluster.nodes])


@pytest.fixture(scope="session")
def engines(cluster: Cluster, certificates: pki.ClusterPki, tmp_path_factory: pytest.TempPathFactory,
            cluster_timings: dict[str, float]) -> Iterator[Engines]:
    """`agentloop engine launch --ray` in node0: two fake servers, TLS and tokens, one per worker node."""
    folder = tmp_path_factory.mktemp("engines")
    discovery, log = folder / "discovery.json", folder / "launch.log"
    settings = [arg for key, value in ENGINE.items() if key != "kind" for arg in ("--set", f"{key}={value}")]
    began = time.monotonic()
    launcher = cluster.head.spawn(
        [*AGENTLOOP, "engine", "launch", "--ray", "--ray-address", cluster.ray_address, "--adapter", "fake",
         *settings, "--dp", "2", "--cpus-per-server", "1", "--resources-per-server", json.dumps(SHARED),
         "--discovery-file", str(discovery),
         "--log-dir", str(folder / "logs"), "--tls-cert", str(certificates.server_cert),
         "--tls-key", str(certificates.server_key), "--tls-ca", str(certificates.ca),
         "--auth-token-file", str(certificates.token), "--admin-token-file", str(certificates.admin_token)],
        log=log, stdout=subprocess.PIPE,
    )
    try:
        announced(launcher, r"2 fake server\(s\) serving over Ray placement groups", 120, log)
        cluster_timings["engine launch --ray (2 servers)"] = time.monotonic() - began
        yield Engines(discovery, json.loads(discovery.read_text())["servers"])
    finally:
        assert stop(launcher) == 0, log.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="session")
def tool_server(cluster: Cluster, certificates: pki.ClusterPki,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolServer]:
    """The built-in tools served from node3 (no Ray there), with TLS and a token."""
    node, log = cluster.nodes[3], tmp_path_factory.mktemp("tools") / "tools.log"
    server = node.spawn(
        [*AGENTLOOP, "tools", "serve", "--config", "builtin", "--host", node.address, "--port", "0",
         "--tls-cert", str(certificates.server_cert), "--tls-key", str(certificates.server_key),
         "--auth-token-file", str(certificates.token)],
        log=log, stdout=subprocess.PIPE,
    )
    try:
        address = announced(server, r"listening on (\S+)", 60, log).group(1)
        yield ToolServer(address, node)
    finally:
        stop(server)
