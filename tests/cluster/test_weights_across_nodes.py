"""Weight pushes across nodes: a trainer in node0 (the head) updates engine servers on node1 and node2 by collective
(a gloo group whose rendezvous is node0's address) and by path (a checkpoint on the storage the nodes share), as
TRL's push does; and a partition of node1 in the middle of a collective update.

These tests start fake servers of their own on node1 and node2 (TLS, tokens, the admin token), beside the shared
ones, and stop them after: the versions they push are not the shared servers' business.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import pki
from .harness import Cluster, Node, skip_reason
from .processes import AGENTLOOP, ENGINE, ROOT, announced, stop

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]

#: The group's timeout in these tests (how long it may take to form, and each collective): the bound on a failed
#: update. The default (WorkerSpec.weight_group_timeout_s) is 300 s.
GROUP_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def weight_servers(cluster: Cluster, certificates: pki.ClusterPki,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Node], list[str]]]:
    """A fake engine server on node1 and one on node2, bound to the node's address; their discovery file."""
    folder = tmp_path_factory.mktemp("weight-servers")
    nodes, processes, addresses = cluster.nodes[1:3], [], []
    try:
        for node in nodes:
            log = folder / f"{node.name}.log"
            process = node.spawn(
                [*AGENTLOOP, "engine", "serve", "--adapter", "fake", "--set", f"vocab_size={ENGINE['vocab_size']}",
                 "--host", node.address, "--port", "0", "--tls-cert", str(certificates.server_cert),
                 "--tls-key", str(certificates.server_key), "--auth-token-file", str(certificates.token),
                 "--admin-token-file", str(certificates.admin_token)],
                log=log, stdout=subprocess.PIPE,
            )
            processes.append(process)
            addresses.append(announced(process, r"listening on (\S+)", 60, log).group(1))
        discovery = folder / "discovery.json"
        discovery.write_text(json.dumps({
            "servers": [{"address": a, "node_ip": n.address} for a, n in zip(addresses, nodes, strict=True)],
            "security": {"tls": True, "ca_file": str(certificates.ca), "token_file": str(certificates.token),
                         "admin_token_file": str(certificates.admin_token)},
        }))
        yield discovery, nodes, addresses
    finally:
        for process in processes:
            stop(process, 30)


def _driver(cluster: Cluster, mode: str, discovery: Path, folder: Path, timeout_s: float) -> subprocess.Popen:
    return cluster.head.spawn(
        [sys.executable, "-m", "tests.cluster.weights_driver", mode, str(discovery), str(folder), str(timeout_s)],
        log=folder / f"{mode}.log", env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE, stdin=subprocess.PIPE,
    )


def _step(driver: subprocess.Popen, word: str, timeout_s: float, log: Path) -> dict:
    return json.loads(announced(driver, rf"^{word} (.*)", timeout_s, log).group(1))


def test_the_trl_push_reaches_engines_on_other_nodes_by_collective_and_by_path(
    cluster: Cluster, weight_servers: tuple[Path, list[Node], list[str]], cluster_timings: dict[str, float],
    tmp_path: Path,
) -> None:
    discovery, _, addresses = weight_servers
    driver = _driver(cluster, "push", discovery, tmp_path, 60)
    log = tmp_path / "push.log"
    try:
        collective = _step(driver, "collective", 90, log)
        path = _step(driver, "path", 60, log)
        print(json.dumps({"collective": collective, "path": path}, indent=1))
        assert driver.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    # one broadcast over a gloo group whose rendezvous is node0's address (the route to the engines), not loopback
    assert collective["transfer"] == "collective" and collective["group_at"] == [cluster.head.address]
    assert path["transfer"] == "path" and path["group_at"] == [cluster.head.address]  # no group for a path
    for step in (collective, path):
        assert step["left_out"] == []
        assert step["versions"] == dict.fromkeys(addresses, step["version"])
        # a generation after the update: every token made by the new version, on both nodes
        assert step["generated"] == {a: [step["version"]] for a in addresses}
    assert path["version"] == collective["version"] + 1
    assert list(tmp_path.glob("*.safetensors")) == []  # the checkpoint is removed once both loaded it
    cluster_timings["weights: collective push to 2 nodes"] = collective["seconds"]
    cluster_timings["weights: path push to 2 nodes"] = path["seconds"]


@pytest.mark.fault
def test_a_partition_during_a_collective_update_fails_it_everywhere_and_the_next_forms_without_the_member(
    cluster: Cluster, weight_servers: tuple[Path, list[Node], list[str]], cluster_timings: dict[str, float],
    tmp_path: Path,
) -> None:
    """The update's first piece is sent, then node1's link goes down: the update fails on every member within
    the group's timeout and a margin, none applies it (node2 keeps its version), the trainer's error names node1
    as lost; the next update forms a group of node2 alone; healed, a group of both takes the one after."""
    discovery, nodes, (lost, kept) = weight_servers
    driver = _driver(cluster, "fault", discovery, tmp_path, GROUP_TIMEOUT_S)
    log = tmp_path / "fault.log"

    def tell(word: str, at: float) -> None:
        driver.stdin.write(f"{word} {at}\n")
        driver.stdin.flush()

    try:
        _step(driver, "warm", 90, log)
        formed = _step(driver, "formed", 30, log)
        _step(driver, "midway", 30, log)
        try:
            cut_at = time.time()
            cluster.partition(nodes[0])
            tell("cut", cut_at)
            failed = _step(driver, "failed", 60, log)
            excluded = _step(driver, "excluded", 60, log)
        finally:
            at = time.time()
            cluster.heal(nodes[0])
        tell("healed", at)
        rejoined = _step(driver, "rejoined", 60, log)
        assert driver.wait(30) == 0, log.read_text()[-3000:]
    finally:
        cluster.heal(nodes[0])
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    first = formed["version"]
    assert formed["members"] == sorted([lost, kept]) and formed["versions"] == {lost: first, kept: first}
    # failed cleanly: an error naming the lost member, every member's answer (or its loss) within the bound
    print(json.dumps({"formed": formed, "failed": failed, "excluded": excluded, "rejoined": rejoined}, indent=1))
    assert failed["error"] is not None and f"{lost}: lost: does not answer" in failed["error"]
    assert f"{kept}: lost" not in failed["error"] and kept in failed["error"]  # it answered: the group failed
    assert failed["group"] is None  # the broken group was let go
    bound = GROUP_TIMEOUT_S + 5.0 + GROUP_TIMEOUT_S + 3.0  # the leader's timeout, the lost margin, and slack
    assert failed["failed_s"] < bound
    assert set(failed["answered_s"]) == {lost, kept} and max(failed["answered_s"].values()) < bound
    # nothing half-applied: node2 (the one that answers) still has the version before
    assert failed["versions"] == {kept: first}
    # the next update: node1 left out, a new group of node2 alone
    assert excluded["left_out"] == [lost] and excluded["members"] == [kept]
    assert excluded["group"] not in (None, formed["group"]) and excluded["versions"] == {kept: first + 2}
    # healed: node1 never applied the failed update either; a group of both takes the next one
    assert rejoined["versions_back"] == {lost: first, kept: first + 2}
    assert rejoined["members"] == sorted([lost, kept]) and rejoined["group"] not in (None, excluded["group"])
    assert rejoined["versions"] == {lost: first + 3, kept: first + 3}
    assert rejoined["generated"] == {lost: [first + 3], kept: [first + 3]}
    cluster_timings["weights: partitioned update failed after"] = failed["failed_s"]
    cluster_timings["weights: kept member answered the failure after"] = failed["answered_s"][kept]
    cluster_timings["weights: lost member reported after"] = failed["answered_s"][lost]
    cluster_timings["weights: next update without it took"] = excluded["seconds"]
    cluster_timings["weights: node1 partitioned for"] = at - cut_at
    cluster_timings["weights: healed member answered after"] = rejoined["answered_after_s"]
