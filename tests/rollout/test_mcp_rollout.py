"""`agentloop rollout` with MCP servers as its tools (the small model on the embedded engine, its tool calls
constrained to their schemas): server-memory from npm, sandboxed and not, called by the trajectories; once the
rollout ends, no MCP server process is left, no trajectory folder in the temporary folder, and nothing beside the
server's script (docs/tools.md, "Each trajectory's world")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

pytest.importorskip("mcp", reason="the mcp extra is not installed (make setup installs it)")

ROOT = Path(__file__).resolve().parents[2]
MEMORY = ROOT / "tests" / "tools" / "mcp_servers" / "node_modules" / ".bin" / "mcp-server-memory"
PACKAGE = ROOT / "tests" / "tools" / "mcp_servers" / "node_modules" / "@modelcontextprotocol" / "server-memory"


@pytest.mark.slow
@pytest.mark.skipif(not MEMORY.exists(), reason="npm MCP servers not installed (make setup installs them)")
def test_a_rollout_leaves_no_mcp_process_and_no_folder(tmp_path: Path) -> None:
    marker = f"agentloop-test-{uuid.uuid4().hex}"  # an argument the server ignores: finds its processes
    memory = {"command": [str(MEMORY), marker], "env": {"MEMORY_FILE_PATH": "{instance_dir}/memory.jsonl"}}
    tools = tmp_path / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": [
        {"mcp": {"name": "memory", **memory, "tools": ["create_entities"]}},
        {"mcp": {"name": "memory-unsandboxed", **memory, "tools": ["read_graph"], "prefix": "u_", "sandbox": False}},
    ]}))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": name, "messages": [{"role": "user", "content": text}]}) + "\n"
                            for name, text in (("a", "Store the fact that the answer is 42, then read the graph."),
                                               ("b", "Read the knowledge graph and tell me what it holds."))))
    out, temp = tmp_path / "out", tmp_path / "tmp"
    temp.mkdir()
    config = tmp_path / "rollout.yaml"
    config.write_text(yaml.safe_dump({
        "engines": {"launch": {"replicas": 1, "engine": {"kind": "embedded", "threads": 1, "max_running": 4}}},
        "tools": {"launch": str(tools)},
        "dataset": {"path": str(rows)},
        "samples_per_prompt": 2,
        "loop": {"constrain_tool_calls": True, "max_assistant_turns": 2, "max_parallel_tool_calls": 1,
                 "max_new_tokens_per_turn": 96, "sampling": {"temperature": 0.7, "seed": 0}},
        "report": False, "report_to": [], "output_dir": str(out),
    }))
    before = set(PACKAGE.rglob("*"))
    result = subprocess.run([sys.executable, "-m", "agentloop_grpc.cli", "rollout", "--config", str(config)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(temp)})
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["infrastructure_failures"] == 0 and summary["tool_call_attempts"] > 0

    left = []
    for process in psutil.process_iter():
        try:
            if marker in " ".join(process.cmdline()) and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    assert left == []
    assert [p.name for p in temp.iterdir() if p.name.startswith("agentloop-mcp-")] == []
    assert set(PACKAGE.rglob("*")) == before
