"""A replica lost in the middle of `agentloop rollout`: the run says so and, with `engines.launch.restart_lost`,
starts it again and routes to it; every sample still finishes (the Router resumes what the lost replica held)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import grpc
import psutil
import yaml

from agentloop_grpc.agent import read_parquet
from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc

from .launching import discovered

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]


def test_a_replica_killed_mid_rollout_is_reported_restarted_and_used(tmp_path):
    out = tmp_path / "out"
    config = {
        # slow fake replicas: the run is still rolling out when one is killed, and after it is back
        "engines": {"launch": {"replicas": 2, "restart_lost": True,
                               "engine": {"kind": "fake", "vocab_size": 49152, "token_latency_s": 0.02}}},
        "tools": {"launch": "builtin"},
        "dataset": {"arithmetic": {"count": 16}},
        "max_concurrency": 4,
        "output_dir": str(out),
    }
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(config))
    discovery = out / "discovery.json"
    process = subprocess.Popen([*AGENTLOOP, "rollout", "--config", str(path)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 120
        while not discovery.exists():
            assert time.monotonic() < deadline and process.poll() is None, "the servers did not come up"
            time.sleep(0.1)
        before = discovered(discovery)
        with grpc.insecure_channel(before[1]) as channel:  # killed while it generates
            load = generation_pb2_grpc.TokenGenerateStub(channel).GetLoad
            while load(generation_pb2.GetLoadRequest(), timeout=5).running_requests == 0:
                assert time.monotonic() < deadline and process.poll() is None, "replica 1 got no request"
                time.sleep(0.05)
        (replica,) = [p for p in psutil.Process(process.pid).children() if "dp_rank=1" in p.cmdline()]
        replica.kill()
        _, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err[-3000:]
    after = discovered(discovery)
    assert after[0] == before[0] and after[1] != before[1], (before, after)
    assert f"engine server {before[1]} (dp rank 1) lost: its process was killed by SIGKILL" in err, err[-3000:]
    assert f"engine server dp rank 1 restarted at {after[1]}" in err, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trajectories"] == 16 and summary["infrastructure_failures"] == 0, summary
    trajectories = read_parquet(out / "trajectories.parquet")
    served = {server for t in trajectories for server in t.servers}
    assert before[1] in served and after[1] in served, served  # the restarted replica took samples too
    # the report names and plots the three servers the run had
    assert f"Engine servers: {before[0]}, {before[1]}, {after[1]}." in (out / "report.html").read_text()
