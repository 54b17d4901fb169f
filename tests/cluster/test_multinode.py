"""Rollouts across nodes: the shared cluster of tests/cluster/conftest.py (engine servers on node1 and node2, the
tool server on node3, drivers in node0), behind TLS and tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentloop_grpc.agent import read_parquet

from . import pki
from .harness import Cluster, skip_reason
from .processes import AGENTLOOP, ENGINE, ROOT, Engines, ToolServer, announced

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]


def _rollout_config(folder: Path, engines: dict, tools: dict) -> Path:
    config = {
        "engines": engines,
        "tools": tools,
        "dataset": {"arithmetic": {"count": 4, "seed": 1}},
        "samples_per_prompt": 2,
        "loop": {"max_new_tokens_per_turn": 16, "sampling": {"temperature": 1.0, "seed": 3}},
        "output_dir": str(folder / "out"),
        "report": False,
        # new sessions to the least loaded server: the shared system prompt would draw every group to one
        "router": {"placement": "sticky_least_loaded"},
    }
    path = folder / "rollout.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


_SECURITY_CHECKS = """
import asyncio, sys, grpc
from agentloop_grpc.channels import open_channel
from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc

async def info(address, security):
    async with open_channel(address, security) as channel:
        try:
            reply = await engine_pb2_grpc.EngineControlStub(channel).GetServerInfo(
                engine_pb2.GetServerInfoRequest(), timeout=5, wait_for_ready=False)
            return f"ok dp_rank={reply.dp_rank}"
        except grpc.aio.AioRpcError as error:
            return error.code().name

async def main(address, ca, token):
    print(await info(address, ClientSecurity(ca_file=ca, token_file=token)))
    print(await info(address, ClientSecurity(ca_file=ca)))  # no token
    print(await info(address, None))  # plaintext to a TLS port
    print(await info(address, ClientSecurity(ca_file=ca, token_file=token, server_name="10.238.0.99")))

asyncio.run(main(*sys.argv[1:]))
"""


def test_engines_run_one_per_worker_node_on_its_address_behind_tls_and_tokens(
    cluster: Cluster, engines: Engines, certificates: pki.ClusterPki
) -> None:
    workers = {node.address for node in cluster.nodes[1:3]}
    assert sorted(s["dp_rank"] for s in engines.servers) == [0, 1]
    assert {s["node_ip"] for s in engines.servers} == workers  # one server per worker node, none on the head
    assert all(s["address"].startswith(s["node_ip"] + ":") for s in engines.servers)
    security = json.loads(engines.discovery.read_text())["security"]
    assert security == {"tls": True, "ca_file": str(certificates.ca), "token_file": str(certificates.token),
                        "admin_token_file": str(certificates.admin_token)}
    for server in engines.servers:  # from the head's namespace, by the node's address
        checked = cluster.head.run([sys.executable, "-c", _SECURITY_CHECKS, server["address"], str(certificates.ca),
                                    str(certificates.token)], timeout=60)
        assert checked.stdout.split("\n")[:4] == [
            f"ok dp_rank={server['dp_rank']}", "UNAUTHENTICATED", "UNAVAILABLE", "UNAVAILABLE"
        ], checked.stderr[-2000:]


def test_rollout_across_nodes_is_token_exact_with_a_single_node_run(
    cluster: Cluster, engines: Engines, tool_server: ToolServer, certificates: pki.ClusterPki, tmp_path: Path
) -> None:
    # the same seeded rollout on this machine's loopback (servers launched by the run itself), meanwhile
    single = tmp_path / "single"
    single.mkdir()
    baseline = subprocess.Popen(
        [*AGENTLOOP, "rollout", "--config", str(_rollout_config(
            single, {"launch": {"replicas": 2, "engine": ENGINE}}, {"launch": "builtin"}))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    across = tmp_path / "across"
    across.mkdir()
    config = _rollout_config(across, {"discovery_file": str(engines.discovery)}, {
        "address": tool_server.address, "launch": None,
        "security": {"ca_file": str(certificates.ca), "token_file": str(certificates.token)},
    })
    result = cluster.head.run([*AGENTLOOP, "rollout", "--config", str(config)], timeout=300,
                              env={"HF_HUB_OFFLINE": "1"})
    _, err = baseline.communicate(timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert baseline.returncode == 0, err[-3000:]

    mine = {t.sample_id: t for t in read_parquet(across / "out" / "trajectories.parquet")}
    theirs = {t.sample_id: t for t in read_parquet(single / "out" / "trajectories.parquet")}
    assert len(mine) == 8 and mine.keys() == theirs.keys()
    assert not any(t.infrastructure_failure or t.failed for t in mine.values())
    for sample_id, trajectory in mine.items():
        expected = theirs[sample_id]
        assert trajectory.prompt_ids == expected.prompt_ids, sample_id
        assert trajectory.response_ids == expected.response_ids, sample_id
        assert trajectory.response_mask == expected.response_mask, sample_id
        assert trajectory.response_logprobs == expected.response_logprobs, sample_id
        assert trajectory.reward == expected.reward, sample_id
    # the engines served from both worker nodes, by their addresses; the tools from node3
    assert {s for t in mine.values() for s in t.servers} == {s["address"] for s in engines.servers}
    assert sum(len(t.response_ids) for t in mine.values()) > 0


@pytest.mark.fault
def test_a_partitioned_engine_node_is_taken_out_its_work_resumes_elsewhere_and_it_rejoins(
    cluster: Cluster, engines: Engines, cluster_timings: dict[str, float], tmp_path: Path
) -> None:
    """Eight generations of 1,500 tokens (15 s each) over both engine nodes; node1's link goes down 1 s in. The
    Router takes its server out, its generations resume on node2 from the tokens received, all eight end with
    every token, and each is the engines' stream exactly; healed, node1's server rejoins and takes new sessions."""
    cut = engines.servers[0]
    node = next(n for n in cluster.nodes if n.address == cut["node_ip"])
    sessions, tokens, log = 8, 1500, tmp_path / "driver.log"
    driver = cluster.head.spawn(
        [sys.executable, "-m", "tests.cluster.partition_driver", str(engines.discovery), cut["address"],
         str(sessions), str(tokens), str(ENGINE["vocab_size"])],
        log=log, env={"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stdin=subprocess.PIPE,
    )

    def tell(word: str, at: float) -> None:
        driver.stdin.write(f"{word} {at}\n")
        driver.stdin.flush()

    try:
        placed = json.loads(announced(driver, r"^streaming (.*)", 60, log).group(1))
        assert set(placed.values()) == {s["address"] for s in engines.servers}  # both nodes have work
        on_cut = {s for s, server in placed.items() if server == cut["address"]}
        time.sleep(1)
        at = time.time()
        cluster.partition(node)
        tell("partitioned", at)
        done = json.loads(announced(driver, r"^done (.*)", 120, log).group(1))
        at = time.time()
        cluster.heal(node)
        tell("healed", at)
        rejoined = json.loads(announced(driver, r"^rejoined (.*)", 120, log).group(1))
        assert driver.wait(30) == 0
    finally:
        cluster.heal(node)
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    # nothing lost: every generation complete, the cut node's resumed on the other one, the rest undisturbed
    assert done["tokens"] == dict.fromkeys(placed, tokens)
    other = next(s["address"] for s in engines.servers if s is not cut)
    assert {s: tuple(v) for s, v in done["servers"].items()} == {
        s: (cut["address"], other) if s in on_cut else (other,) for s in placed
    }
    assert all(0 < done["cut_at"][s] < tokens for s in on_cut)  # token-exact: first stream to the cut, then the
    assert all(done["cut_at"][s] == tokens for s in placed.keys() - on_cut)  # other's continuation (the driver)
    detected, resumed = done["detected_s"], max(done["resumed_s"].values())
    cluster_timings["partition: server taken out after"] = detected
    cluster_timings["partition: last generation resumed after"] = resumed
    cluster_timings["heal: server routed to again after"] = rejoined["rejoined_s"]
    # within the liveness bound (RouterConfig.liveness_timeout_s, 10 s; the channel's keepalive is 5 s + 5 s)
    assert detected is not None and detected <= 10 + 1.5
    assert rejoined["new_session_on_it"] is not None
