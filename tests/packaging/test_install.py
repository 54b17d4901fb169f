"""What a user installing from PyPI gets: the sdist, a wheel built from it, and that wheel in a clean venv without
extras (no system site packages, dependencies from the package index or pip's cache): the CI step of packaging.

The sdist is built from this checkout with ``python -m build`` and the wheel from the extracted sdist with pip, as
``python -m build`` and ``pip install agentloop-grpc`` from an sdist do; both without build isolation, using this
venv's pinned grpcio-tools and mypy-protobuf (an isolated build would download them again each run).
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import agentloop_grpc

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROTOS = ("engine.proto", "generation.proto", "tool.proto")
STUB_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")

#: A generated-stub client, run by the clean venv's Python against a fake engine server.
CLIENT = """
import json, sys
import grpc
from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

with grpc.insecure_channel(sys.argv[1]) as channel:
    info = engine_pb2_grpc.EngineControlStub(channel).GetServerInfo(engine_pb2.GetServerInfoRequest(), timeout=30)
    request = generation_pb2.GenerateRequest(
        request_id="smoke", prompt_ids=[1, 2, 3],
        sampling_params=generation_pb2.SamplingParams(max_new_tokens=5, seed=0))
    tokens, completions = [], []
    for response in generation_pb2_grpc.TokenGenerateStub(channel).Generate(request, timeout=30):
        if response.HasField("chunk"):
            tokens.extend(response.chunk.token_ids)
        else:
            tokens.extend(response.complete.tokens.token_ids)
            completions.append(response.complete.completion_tokens)
print(json.dumps({"engine_kind": info.engine_kind, "vocab_size": info.vocab_size, "tokens": tokens,
                  "completions": completions}))
"""


@dataclass(frozen=True)
class Install:
    sdist: Path
    source: Path  # the extracted sdist the wheel was built in
    wheel: Path
    venv: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH, so the installed copy is the only agentloop_grpc found."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    return env


def run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run outside the checkout (so nothing imports it by accident); fail with the output on a non-zero exit."""
    done = subprocess.run(args, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def install(tmp_path_factory) -> Install:
    tmp = tmp_path_factory.mktemp("install")
    dist = tmp / "dist"
    run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(dist), str(REPO)], tmp, 120)
    (sdist,) = dist.glob("agentloop_grpc-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp / "src", filter="data")
    (source,) = (tmp / "src").iterdir()
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps", "--wheel-dir",
         str(dist), str(source)], tmp, 180)
    (wheel,) = dist.glob("agentloop_grpc-*.whl")
    venv = tmp / "venv"
    # without pip: this venv's pip installs into it (--python), which spares seeding a pip of its own; no
    # bytecode compilation of the dependencies either (imports compile what they load)
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, 60)
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-compile",
         str(wheel)], tmp, 300)
    return Install(sdist, source, wheel, venv)


def test_the_sdist_carries_the_contracts_and_what_the_build_hook_reads_but_no_generated_stubs(install):
    with tarfile.open(install.sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {f"protos/agentloop/v1/{proto}" for proto in PROTOS} <= names
    assert {"setup.py", "protos/generate_python.py", "LICENSE", "examples/demo.yaml"} <= names
    assert not [name for name in names if name.endswith(STUB_SUFFIXES)]


def test_building_the_wheel_writes_no_stubs_into_the_source_tree(install):
    assert sorted(p.name for p in (install.source / "agentloop_grpc" / "v1").iterdir()) == ["__init__.py"]


def test_the_wheel_ships_stubs_contracts_examples_and_the_license(install):
    with zipfile.ZipFile(install.wheel) as archive:
        names = set(archive.namelist())
    assert {f"agentloop_grpc/protos/agentloop/v1/{proto}" for proto in PROTOS} <= names
    assert {f"agentloop_grpc/v1/{proto[:-6]}{suffix}" for proto in PROTOS for suffix in STUB_SUFFIXES} <= names
    assert "agentloop_grpc/examples/demo.yaml" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)


def test_the_command_answers_help_and_version_without_extras(install, tmp_path):
    helped = run([install.bin("agentloop"), "--help"], tmp_path, 60)
    for command in ("engine", "tools", "rollout", "train"):
        assert command in helped.stdout
    versioned = run([install.bin("agentloop"), "--version"], tmp_path, 60)
    assert versioned.stdout.strip() == f"agentloop-grpc {agentloop_grpc.__version__}"


def test_the_installed_package_finds_its_contracts_and_examples(install, tmp_path):
    printed = run([install.bin("python"), "-c", "import agentloop_grpc as a; print(a.__file__); "
                   "print(a.protos_dir()); print(a.examples_dir())"], tmp_path, 60)
    package, protos, examples = (Path(line) for line in printed.stdout.split())
    assert package.is_relative_to(install.venv)  # the installed copy, not this checkout
    assert protos == package.parent / "protos" and examples == package.parent / "examples"
    assert sorted(p.name for p in (protos / "agentloop" / "v1").glob("*.proto")) == list(PROTOS)
    assert (examples / "demo.yaml").is_file()


def test_a_fake_engine_server_answers_a_generated_stub_client(install, tmp_path):
    log = tmp_path / "server.log"
    with log.open("w") as stderr:  # a file, not a pipe nobody reads: the server never blocks on its log
        server = subprocess.Popen([install.bin("agentloop"), "engine", "serve", "--adapter", "fake", "--port", "0"],
                                  cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(server.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=60), "the server printed nothing in 60 s"
        first_line = server.stdout.readline()
        assert first_line.startswith("agentloop engine listening on 127.0.0.1:"), (first_line, log.read_text())
        address = first_line.split()[4]
        (tmp_path / "client.py").write_text(CLIENT)
        answered = json.loads(run([install.bin("python"), "client.py", address], tmp_path, 60).stdout)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert answered["engine_kind"] == "fake"
    assert len(answered["tokens"]) == 5 and answered["completions"] == [5]
    assert all(0 <= token < answered["vocab_size"] for token in answered["tokens"])


@pytest.mark.parametrize(("code", "what"), [
    ("from agentloop_grpc.engine_adapters.factory import make_adapter; make_adapter('embedded')",
     "the embedded engine"),
    ("from pathlib import Path; from agentloop_grpc.common import model_store; model_store.load(Path('.'))",
     "loading a model's weights"),
], ids=["engine", "model-load"])
def test_a_part_whose_extra_is_missing_names_the_extra(install, tmp_path, code, what):
    failed = subprocess.run([install.bin("python"), "-c", code], cwd=tmp_path, env=clean_env(), capture_output=True,
                            text=True, timeout=60)
    assert failed.returncode != 0
    assert f"{what} needs `pip install 'agentloop-grpc[embedded]'` (module 'torch' is not installed)" in failed.stderr


def test_serving_an_engine_whose_extra_is_missing_prints_one_error_line(install, tmp_path):
    model = tmp_path / "model"  # passes the file check before listening; loading it would need torch
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    failed = subprocess.run([install.bin("agentloop"), "engine", "serve", "--adapter", "embedded", "--model",
                             str(model), "--port", "0"], cwd=tmp_path, env=clean_env(), capture_output=True,
                            text=True, timeout=60)
    assert failed.returncode == 2 and "listening" not in failed.stdout
    assert failed.stderr.strip() == ("error: the embedded engine needs `pip install 'agentloop-grpc[embedded]'` "
                                     "(module 'torch' is not installed)"), failed.stderr


def test_a_rollout_that_would_write_a_report_without_its_extra_stops_before_starting(install, tmp_path):
    demo = Path(agentloop_grpc.__file__).parents[1] / "examples" / "demo.yaml"
    failed = subprocess.run([install.bin("agentloop"), "rollout", "--config", str(demo), "--output-dir",
                             str(tmp_path / "out")], cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                            timeout=60)
    assert failed.returncode == 2, failed.stderr
    assert "the report's plots need `pip install 'agentloop-grpc[rollout]'`" in failed.stderr
    assert not (tmp_path / "out" / "logs").exists()  # no server was launched
