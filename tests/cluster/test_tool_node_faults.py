"""The tool server's node partitioned mid-rollout: ``agentloop rollout`` in node0 (engines on node1 and node2 from the
discovery file, tools on node3, TLS and tokens), its samples run by ``tool_fault_loop.GatedToolLoop``. The samples that
reach the tool server during the partition end within seconds as infrastructure failures, never trained on; the
others complete, token-exact. The shared cluster of conftest.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from agentloop_grpc.agent import Trajectory, read_parquet
from agentloop_grpc.agent.config import SamplingConfig
from agentloop_grpc.agent.generation import seed_offset
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.integrations.trl.fields import trl_fields
from agentloop_grpc.router import GenerateCall, Router

from . import pki
from .harness import Cluster, skip_reason
from .processes import AGENTLOOP, ENGINE, ROOT, Engines, ToolServer

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]

#: Every turn stops at one of these ids (1 in 25 of the vocabulary: turns of about 25 tokens, as a model's turns end
#: on its own; the fake engine's hash stream draws them as any other), so that a turn can end in a tool call.
SAMPLING = {"temperature": 1.0, "seed": 3, "stop_token_ids": list(range(3, int(ENGINE["vocab_size"]), 25))}
MAX_NEW_TOKENS, RESPONSE_BUDGET = 256, 2048
#: Sample ids: ``early`` ones run (tools and all) before the partition; ``mid`` ones make their calculator instance
#: before it and call it after; the others start after it, ``late`` ones calling the calculator, ``plain`` ones
#: offered no tools.
EARLY, MID, LATE, PLAIN = ["early-0", "early-1"], ["mid-0", "mid-1"], ["late-0", "late-1"], ["plain-0", "plain-1"]


def _rollout_config(folder: Path, engines: Engines, tools: ToolServer, certificates: pki.ClusterPki) -> Path:
    rows = [{"id": name, "messages": [{"role": "user", "content": f"What is 6 times 7? ({name})"}],
             "tools": [] if name in PLAIN else ["calculator"], "sampling": SAMPLING}
            for name in EARLY + MID + LATE + PLAIN]
    dataset = folder / "rows.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    gate = folder / "gate"
    gate.mkdir()
    config = {
        "engines": {"discovery_file": str(engines.discovery)},
        "tools": {"address": tools.address, "launch": None,
                  "security": {"ca_file": str(certificates.ca), "token_file": str(certificates.token)}},
        "dataset": {"path": str(dataset), "default_loop": "gated"},
        "loops": {"gated": {"path": "tests.cluster.tool_fault_loop:GatedToolLoop",
                            "kwargs": {"gate_dir": str(gate), "early": len(EARLY), "mid": len(MID)}}},
        "loop": {"max_new_tokens_per_turn": MAX_NEW_TOKENS, "response_budget": RESPONSE_BUDGET,
                 "max_assistant_turns": 4},
        "output_dir": str(folder / "out"),
        "report": False,
        "report_to": [],  # no tracker
        "router": {"placement": "sticky_least_loaded"},
    }
    path = folder / "rollout.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _wait_for(path: Path, process: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {path.name} (rollout exit {process.poll()}):\n"
                                 f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.02)


async def _model_turns_are_the_engines(trajectories: list[Trajectory]) -> int:
    """Every model turn (a run of mask 1) of ``trajectories`` is the fake engine's stream for its context, token for
    token and logprob for logprob, as an in-process engine of the same config makes it; return the tokens checked."""
    engine = await create_server(FakeEngine(FakeEngineConfig(vocab_size=int(ENGINE["vocab_size"]))), "127.0.0.1:0")
    await start_adapter(engine)
    checked = 0
    try:
        async with Router([f"127.0.0.1:{engine.port}"]) as reference:
            for t in trajectories:
                starts = [i for i, m in enumerate(t.response_mask) if m and (i == 0 or not t.response_mask[i - 1])]
                for turn, start in enumerate(starts):
                    end = next((i for i in range(start, len(t.response_mask)) if not t.response_mask[i]),
                               len(t.response_mask))
                    params = SamplingConfig(**SAMPLING).params(min(MAX_NEW_TOKENS, RESPONSE_BUDGET - start),
                                                               seed_offset(t.sample_id, turn))
                    expected = await reference.generate(GenerateCall(
                        f"ref-{t.sample_id}-{turn}", [*t.prompt_ids, *t.response_ids[:start]], params))
                    assert t.response_ids[start:end] == expected.token_ids, (t.sample_id, turn)
                    assert t.response_logprobs[start:end] == expected.logprobs, (t.sample_id, turn)
                    checked += end - start
    finally:
        await engine.stop(grace_s=0.1)
    return checked


@pytest.mark.fault
def test_a_partitioned_tool_node_fails_its_trajectories_fast_as_infrastructure_and_loses_nothing_else(
    cluster: Cluster, engines: Engines, tool_server: ToolServer, certificates: pki.ClusterPki,
    cluster_timings: dict[str, float], tmp_path: Path
) -> None:
    """Two samples use the calculator before node3's link goes down; during the partition two call the instance
    they made before it, two more make theirs, and two offered no tools generate. The four that reach the tool
    server end as infrastructure failures (cause tool_server_unavailable) within the tool client's keepalive bound,
    not its 60 s deadline, and are kept out of the trainer batch and TRL's loss; the other four complete, every
    model token the engines' own; healed, the tool server takes connections again."""
    config = _rollout_config(tmp_path, engines, tool_server, certificates)
    gate, log = tmp_path / "gate", tmp_path / "rollout.log"
    rollout = cluster.head.spawn([*AGENTLOOP, "rollout", "--config", str(config)], log=log,
                                 env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    node = tool_server.node
    try:
        _wait_for(gate / "ready", rollout, 180, log)  # the early samples ended, tools and all; the mid ones wait
        cluster.partition(node)
        partitioned = time.time()
        (gate / "go").touch()
        assert rollout.wait(120) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        cluster.heal(node)
        if rollout.poll() is None:
            rollout.kill()
            rollout.wait()

    out = tmp_path / "out"
    trajectories = {t.sample_id.split("/")[0]: t for t in read_parquet(out / "trajectories.parquet")}
    events = [json.loads(line) for line in (gate / "events.jsonl").read_text().splitlines()]
    ended = {e["sample"].split("/")[0]: e for e in events if e["event"] == "ended"}
    # every sample is accounted for: nothing lost, nothing twice
    assert sorted(trajectories) == sorted(EARLY + MID + LATE + PLAIN) == sorted(ended)
    # the early ones used the tool server and ended before the partition; the mid ones made their instances before
    calls = [e for e in events if e["event"] == "call"]
    assert {c["method"] for c in calls if c["ended"] < partitioned and c["error"] is None} == {
        "create_instance", "execute", "calc_reward", "release"}
    assert all(ended[s]["ended"] < partitioned for s in EARLY)
    for sample in EARLY:
        assert [m.error for m in trajectories[sample].tool_call_metrics] == [None]  # the call went through
    assert sorted(c["args"][1].split("/")[0] for c in calls if c["method"] == "create_instance"
                  and c["ended"] < partitioned and c["error"] is None) == sorted(EARLY + MID)
    # those that reached it during the partition: infrastructure failures, with the cause, quickly
    failed_calls = [c for c in calls if c["started"] >= partitioned]
    assert {c["method"] for c in failed_calls} == {"create_instance", "execute", "release"}  # release: best effort
    assert all(c["error"] == "ToolInfrastructureError" and c["cause"] == "tool_server_unavailable"
                                for c in failed_calls)
    for sample in MID + LATE:
        t = trajectories[sample]
        assert [m.error for m in t.tool_call_metrics] == ["infrastructure"], sample  # the call on record as such
        assert t.failed and t.infrastructure_failure and t.infrastructure_cause == "tool_server_unavailable", sample
        assert t.termination.value == "error" and "UNAVAILABLE" in (t.error or "")
    detected = max(c["ended"] for c in failed_calls) - partitioned
    over = max(ended[s]["ended"] for s in MID + LATE) - partitioned
    cluster_timings["tool partition: failing tool calls failed after"] = detected
    cluster_timings["tool partition: last trajectory ended after"] = over
    # the tool client's channel: a ping after 5 s without data, its answer due 5 s later (and the kernel gives up on
    # unacknowledged data after 5 s), then at most two more tries of a call that is safe to repeat, each a
    # connection attempt bounded by the same 5 s: well within the client's 60 s deadline
    assert over <= 20 + 2
    # the others complete: nothing lost, every model token the engines'
    done = [trajectories[s] for s in EARLY + PLAIN]
    assert not any(t.failed or t.infrastructure_failure for t in done)
    assert all(t.termination.value in ("no_tool_call", "stop") for t in done)
    assert asyncio.run(_model_turns_are_the_engines(done)) == sum(t.model_tokens for t in done) > 0
    # never trained on: summary counts them by cause; batch.pt and TRL's fields leave them out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trajectories"] == len(trajectories)
    assert summary["infrastructure_failures"] == len(MID + LATE)
    assert summary["infrastructure_causes"] == {"tool_server_unavailable": len(MID + LATE)}
    import torch

    batch = torch.load(out / "batch.pt", weights_only=True)
    assert sorted(s.split("/")[0] for s in batch["excluded"]) == sorted(MID + LATE)
    assert sorted(s.split("/")[0] for s in batch["sample_ids"]) == sorted(EARLY + PLAIN)
    ordered = list(trajectories.values())
    fields = trl_fields(ordered, placeholder_id=0)
    for t, reward, mask in zip(ordered, fields["agentloop_reward"], fields["env_mask"], strict=True):
        if t.failed:
            assert reward is None and not any(mask)
        else:
            assert reward == t.reward and mask == list(t.response_mask)
    # healed: the tool server takes connections from node0 again (bash's /dev/tcp: no interpreter to start)
    host, port = tool_server.address.rsplit(":", 1)
    reached = cluster.head.run(["timeout", "20", "bash", "-c", f"until : > /dev/tcp/{host}/{port}; do sleep 0.2; done"],
                               timeout=30)
    assert reached.returncode == 0, reached.stderr
