"""Engine configs: one pydantic model per adapter keyed on ``kind``, built into adapters by ``make_adapter``, carried
to server processes as ``--set`` flags, and read by ``agentloop engine serve`` with errors that name the field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from pydantic import ValidationError

from agentloop_grpc.engine_adapters.config import ENGINE_KINDS, engine_config
from agentloop_grpc.engine_adapters.config_flags import apply_setting, settings
from agentloop_grpc.engine_adapters.embedded.config import EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.sglang.config import ActorNaming, SglangEngineConfig
from agentloop_grpc.engine_adapters.vllm.config import VllmEngineConfig
from agentloop_grpc.launch.launcher import EngineLaunch

ROOT = Path(__file__).resolve().parents[2]
AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]
WIDE = {**os.environ, "COLUMNS": "300"}  # typer boxes errors to the terminal's width: one line each


def test_make_adapter_builds_from_a_model_or_its_fields() -> None:
    engine = make_adapter("fake", {"max_running": 3, "token_latency_s": "0.5"})
    assert isinstance(engine, FakeEngine) and engine.config.max_running == 3 and engine.config.token_latency_s == 0.5
    config = FakeEngineConfig(vocab_size=100)
    built = make_adapter("fake", config)
    assert isinstance(built, FakeEngine) and built.config is config
    with pytest.raises(ValueError, match="configures the fake adapter, not embedded"):
        make_adapter("embedded", config)
    with pytest.raises(ValueError, match="no adapter is named 'tgi'"):
        make_adapter("tgi")


def test_every_config_shares_the_placement_check_and_forbids_unknown_fields() -> None:
    assert ENGINE_KINDS == ("embedded", "vllm", "sglang", "fake")
    for kind in ENGINE_KINDS:
        with pytest.raises(ValidationError, match="dp_rank"):
            engine_config(kind, {"dp_rank": 2, "dp_size": 2})
        with pytest.raises(ValidationError, match="max_runing"):
            engine_config(kind, {"max_runing": 4})
    with pytest.raises(ValidationError, match="max_running"):
        SglangEngineConfig.model_validate({"max_running": 4})  # SGLang's limits are set where its actors are deployed


@pytest.mark.parametrize("config", [
    EmbeddedEngineConfig(model="/models/x", threads=1, max_running=8, prefix_cache_tokens=0),
    VllmEngineConfig(enforce_eager=False, cpu_cores="0", kv_cache_bytes=1 << 31, dtype="bfloat16"),
    SglangEngineConfig(naming=ActorNaming(prefix="policy", namespace="rl"), tp_size=2, dp_rank=1, dp_size=2),
    FakeEngineConfig(token_latency_s=0.001, vocab_size=49_152, dp_rank=0, dp_size=3, default_max_new_tokens=0),
], ids=lambda config: config.kind)
def test_a_config_survives_the_command_line(config) -> None:
    fields: dict = {}
    for setting in settings(config):
        apply_setting(fields, setting)
    assert engine_config(config.kind, fields) == config


def test_the_launcher_gives_each_server_its_rank_and_the_config() -> None:
    command = EngineLaunch(engine=FakeEngineConfig(vocab_size=49_152), dp=2).command(1)
    flags = command[command.index("--adapter"):]
    assert flags[:2] == ["--adapter", "fake"]
    assert {"dp_rank=1", "dp_size=2", "vocab_size=49152"} <= set(flags[flags.index("--set"):][1::2])
    embedded = EngineLaunch(dp=2).server_engine(0)
    assert embedded.threads >= 1
    assert EngineLaunch(engine=EmbeddedEngineConfig(threads=3), dp=2).server_engine(0).threads == 3


def test_configs_load_no_engine() -> None:
    """Reading a config (a rollout YAML, the CLI) imports neither torch nor vLLM nor Ray."""
    code = ("import sys; import agentloop_grpc.engine_adapters.config, agentloop_grpc.rollout.config; "
            "print(sorted({'torch', 'vllm', 'ray', 'sglang'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_example_engine_config_is_valid() -> None:
    import yaml

    fields = yaml.safe_load((ROOT / "examples" / "engine.yaml").read_text())
    assert isinstance(engine_config(fields["kind"], fields), EmbeddedEngineConfig)


@pytest.mark.parametrize(("args", "expected"), [
    (["--adapter", "fake", "--set", "max_runing=3"], "max_runing: Extra inputs are not permitted"),
    (["--adapter", "fake", "--set", "max_running=zero"], "max_running: Input should be a valid integer"),
    (["--adapter", "fake", "--set", "dp_rank=2", "--set", "dp_size=2"], "dp_rank must be in [0, dp_size)"),
    (["--adapter", "fake", "--set", "max_running"], "'max_running' is not KEY=VALUE"),
    (["--adapter", "fake", "--set", "default_max_new_tokens=-1"],
     "default_max_new_tokens: Input should be greater than or equal to 0"),
])
def test_a_bad_field_exits_2_naming_it(args: list[str], expected: str) -> None:
    result = subprocess.run([*AGENTLOOP, "engine", "serve", "--port", "0", *args], capture_output=True, text=True,
                            timeout=60, env=WIDE)
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_config_file_and_another_adapter_conflict(tmp_path) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text("kind: vllm\ncpu_cores: 0-1\n")
    result = subprocess.run([*AGENTLOOP, "engine", "serve", "--adapter", "fake", "--config", str(path)],
                            capture_output=True, text=True, timeout=60, env=WIDE)
    assert result.returncode == 2 and "the config is for the vllm adapter, not fake" in result.stderr


def test_serve_reads_the_config_file_and_overrides(tmp_path) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text("kind: fake\nvocab_size: 100\nmax_running: 2\n")
    process = subprocess.Popen([*AGENTLOOP, "engine", "serve", "--config", str(path), "--set", "vocab_size=200",
                                "--port", "0", "--log-level", "WARNING"], stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "listening on 127.0.0.1:" in line and "(adapter fake)" in line
    finally:
        process.terminate()
        process.wait(30)


@pytest.mark.parametrize(("default", "expected"), [(0, 64 - 3), (10, 10), (100, 64 - 3)])
async def test_the_default_length_applies_when_a_request_sets_none(default, expected) -> None:
    """0: up to max_model_len; otherwise the default, capped by the room left (prompt of 3 in 64)."""
    from agentloop_grpc.engine_adapters.server import create_server, start_adapter
    from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

    config = FakeEngineConfig(max_model_len=64, default_max_new_tokens=default)
    server = await create_server(make_adapter("fake", config), "127.0.0.1:0")
    await start_adapter(server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            request = generation_pb2.GenerateRequest(request_id="r", prompt_ids=[5, 6, 7],
                                                     sampling_params=generation_pb2.SamplingParams(ignore_eos=True))
            messages = [m async for m in generation_pb2_grpc.TokenGenerateStub(channel).Generate(request, timeout=30)]
            info = await engine_pb2_grpc.EngineControlStub(channel).GetServerInfo(engine_pb2.GetServerInfoRequest())
    finally:
        await server.stop(grace_s=1)
    assert messages[-1].complete.completion_tokens == expected
    assert info.default_max_new_tokens == default
