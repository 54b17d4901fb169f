"""`agentloop rollout` end to end (real server processes: fake engines launched by the CLI, the built-in tool
server), its outputs and report, bad input, and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from agentloop_grpc.agent import read_parquet

from ..router.conftest import free_port

pytestmark = pytest.mark.slow

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]


def _config(tmp_path: Path, **overrides) -> Path:
    config = {
        "engines": {"launch": {"replicas": 2,
                               "engine": {"kind": "fake", "vocab_size": 49152, "token_latency_s": 0.001}}},
        "tools": {"launch": "builtin"},
        "dataset": {"arithmetic": {"count": 3, "seed": 1}},
        "samples_per_prompt": 2,
        "loop": {"max_new_tokens_per_turn": 16, "sampling": {"temperature": 1.0, "seed": 3}},
        "output_dir": str(tmp_path / "out"),
    }
    config.update(overrides)
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _run(args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([*AGENTLOOP, *args], capture_output=True, text=True, timeout=timeout)


def _closed(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) != 0


def test_rollout_writes_every_output_and_stops_its_servers(tmp_path):
    result = _run(["rollout", "--config", str(_config(tmp_path))])
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    assert "report: " in result.stdout and "rollout summary" in result.stdout
    trajectories = read_parquet(out / "trajectories.parquet")
    assert len(trajectories) == 6 and {t.group_id for t in trajectories} == {f"arith-1-{i}" for i in range(3)}
    assert not any(t.failed for t in trajectories)
    assert len({s for t in trajectories for s in t.servers}) == 2  # both replicas served
    batch = torch.load(out / "batch.pt")
    assert batch["tensors"]["input_ids"].shape[0] == 6 and batch["sample_ids"] == [t.sample_id for t in trajectories]
    trace = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    assert {r["sample_id"] for r in trace} == {t.sample_id for t in trajectories}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trajectories"] == 6 and summary["failures"] == 0
    report = (out / "report.html").read_text()
    for image in ("latency.png", "rewards.png", "servers.png"):  # the timeline is drawn by the page itself
        assert f'src="{image}"' in report
        assert (out / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'id="report-data"' in report and all(f'"id":"{t.sample_id}"' in report for t in trajectories)
    servers = json.loads((out / "discovery.json").read_text())["servers"]
    assert len(servers) == 2 and all(_closed(s["address"]) for s in servers)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"dataset": {"path": "/nonexistent/data.jsonl"}}, "dataset file /nonexistent/data.jsonl does not exist"),
        ({"loop": {"max_assistant_turns": 0}}, "loop.max_assistant_turns: Input should be greater than or equal to 1"),
        ({"loop": {"max_turns": 3}}, "loop.max_turns: Extra inputs are not permitted"),
        ({"engines": {"addresses": ["127.0.0.1:PORT"]}, "router": {"no_server_wait_s": 1}},
         "engine server(s) 127.0.0.1:PORT did not answer as SERVING"),
    ],
    ids=["missing-dataset", "bad-field", "unknown-field", "unreachable-server"],
)
def test_bad_input_ends_with_one_sentence(tmp_path, change, expected):
    port = str(free_port())
    change = json.loads(json.dumps(change).replace("PORT", port))
    result = _run(["rollout", "--config", str(_config(tmp_path, **change))], timeout=120)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert expected.replace("PORT", port) in result.stderr, result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("error:")]) == 1


def test_missing_config_file(tmp_path):
    result = _run(["rollout", "--config", str(tmp_path / "nope.yaml")], timeout=60)
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_port_in_use_is_one_sentence():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _run(["engine", "serve", "--adapter", "fake", "--port", str(port)], timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr and str(port) in result.stderr


def test_ctrl_c_stops_servers_and_keeps_finished_trajectories(tmp_path):
    config = _config(
        tmp_path,
        engines={"launch": {"replicas": 1,
                            "engine": {"kind": "fake", "vocab_size": 49152, "token_latency_s": 0.04}}},
        dataset={"arithmetic": {"count": 40, "seed": 1}},
        samples_per_prompt=1,
        max_concurrency=2,
    )
    # A child inherits an ignored SIGINT (as this process has it under a background shell job, or after a library
    # ignored it): the command gets SIGINT's default, as from a terminal, whatever this process does with it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen([*AGENTLOOP, "rollout", "--config", str(config)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    finally:
        signal.signal(signal.SIGINT, previous)
    trace = tmp_path / "out" / "trace.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # until at least two trajectories ended
        if trace.exists() and trace.read_text().count('"kind": "end"') >= 2:
            break
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "interrupted: servers stopped" in stderr and "Traceback" not in stderr
    kept = read_parquet(tmp_path / "out" / "trajectories.parquet")
    assert 2 <= len(kept) < 40 and not any(t.failed for t in kept)
    servers = json.loads((tmp_path / "out" / "discovery.json").read_text())["servers"]
    assert all(_closed(s["address"]) for s in servers)
