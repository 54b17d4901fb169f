"""Code generation: `make protos` is repeatable and leaves git clean; a wheel built from a clean tree carries
the stubs (the build hook generates them) and works without `make`."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "agentloop_grpc" / "v1"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*_pb2*"))}


@pytest.mark.slow
def test_make_protos_twice_is_identical_and_leaves_git_clean() -> None:
    before = _git("status", "--porcelain")
    subprocess.run(["make", "-s", "protos"], cwd=ROOT, check=True, capture_output=True)
    first = _digest(GENERATED)
    subprocess.run(["make", "-s", "protos"], cwd=ROOT, check=True, capture_output=True)
    assert _digest(GENERATED) == first
    assert {"generation_pb2.py", "generation_pb2.pyi", "engine_pb2_grpc.py", "tool_pb2_grpc.pyi"} <= set(first)
    assert (ROOT / "clients" / "node" / "generated" / "agentloop" / "v1" / "TokenGenerate.ts").exists()
    assert _git("status", "--porcelain") == before
    assert _git("ls-files", "agentloop_grpc/v1", "clients/node/generated").split() == ["agentloop_grpc/v1/__init__.py"]


@pytest.mark.slow
def test_wheel_from_clean_tree_contains_and_imports_stubs(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for name in _git("ls-files", "--cached", "--others", "--exclude-standard").splitlines():
        source = ROOT / name
        if source.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    assert not list((tree / "agentloop_grpc" / "v1").glob("*_pb2*"))  # nothing generated is tracked
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=tree,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("agentloop_grpc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("generation", "engine", "tool"):
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"):
            assert f"agentloop_grpc/v1/{module}{suffix}" in names
    assert "agentloop_grpc/engine_adapters/servicer.py" in names
    # package data the code reads at run time (the model's chat template, the built-in tools' config)
    assert {"agentloop_grpc/common/chat_template.jinja", "agentloop_grpc/tools/builtin.yaml"} <= names
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    probe = (
        "import agentloop_grpc, agentloop_grpc.v1.generation_pb2_grpc as g;"
        "from agentloop_grpc.engine_adapters.servicer import SERVICE_NAMES;"
        "print(agentloop_grpc.__file__); print(','.join(SERVICE_NAMES))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert out[0].startswith(str(target))
    assert out[1] == "agentloop.v1.TokenGenerate,agentloop.v1.EngineControl"


def test_buf_breaking_flags_a_renumbered_field(tmp_path: Path) -> None:
    buf = ROOT / "clients" / "node" / "node_modules" / ".bin" / "buf"
    changed = tmp_path / "protos"
    shutil.copytree(ROOT / "protos", changed)
    proto = changed / "agentloop" / "v1" / "generation.proto"
    text = proto.read_text()
    assert "string session_id = 2;" in text
    proto.write_text(text.replace("string session_id = 2;", "string session_id = 20;"))
    result = subprocess.run(
        [str(buf), "breaking", str(changed), "--against", str(ROOT / "protos")], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert 'field "2" with name "session_id"' in result.stdout + result.stderr
