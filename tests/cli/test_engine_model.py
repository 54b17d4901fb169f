"""`agentloop engine serve --model` (an alias of ``--set model=``) checks the model before the server announces
itself: a Hub id, a missing folder or a folder that is no checkpoint ends with one ``error:`` line and exit 2, and
``engine launch`` and a rollout's launcher refuse it before any server process starts."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from agentloop_grpc.cli.commands import app
from agentloop_grpc.engine_adapters.embedded.config import EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.model_check import ModelNotFoundError, check_model
from agentloop_grpc.engine_adapters.vllm.config import VllmEngineConfig
from agentloop_grpc.launch.launcher import EngineLaunch, EngineLauncher, LaunchError

runner = CliRunner()


@pytest.fixture
def folders(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-weights").mkdir()
    (tmp_path / "no-weights" / "config.json").write_text("{}")
    (tmp_path / "file").write_text("")
    return tmp_path


@pytest.mark.parametrize(("model", "expected"), [
    ("Qwen/Qwen3-0.6B", "error: model 'Qwen/Qwen3-0.6B': no such folder. If it is a Hugging Face Hub id: engines "
                        "load local folders only (nothing is downloaded at run time); download it once, e.g. `hf "
                        "download Qwen/Qwen3-0.6B --local-dir models/Qwen3-0.6B`, and give that folder as the model "
                        "(--model models/Qwen3-0.6B)"),
    ("{tmp}/missing", "error: model '{tmp}/missing': no such folder"),
    ("{tmp}/file", "error: model '{tmp}/file' is a file; give the checkpoint's folder"),
    ("{tmp}/empty", "error: model '{tmp}/empty' has no config.json and no *.safetensors weights: not a Hugging "
                    "Face checkpoint folder (config.json + *.safetensors)"),
    ("{tmp}/no-weights", "error: model '{tmp}/no-weights' has no *.safetensors weights"),
])
@pytest.mark.parametrize("option", [["--model"], ["--set"]])
def test_serve_refuses_a_model_before_listening(folders, model, expected, option):
    model = model.format(tmp=folders)
    value = model if option == ["--model"] else f"model={model}"
    result = runner.invoke(app, ["engine", "serve", "--port", "0", *option, value])
    assert result.exit_code == 2
    assert result.output.splitlines()[0].startswith(expected.format(tmp=folders)), result.output
    assert len(result.output.splitlines()) == 1 and "listening" not in result.output


def test_launch_refuses_a_model_before_any_server_starts(folders):
    result = runner.invoke(app, ["engine", "launch", "--model", "Qwen/Qwen3-0.6B", "--discovery-file",
                                 str(folders / "d.json"), "--log-dir", str(folders / "logs")])
    assert result.exit_code == 2
    assert result.output.startswith("error: model 'Qwen/Qwen3-0.6B': no such folder. If it is")
    assert not (folders / "logs").exists()


def test_the_launcher_refuses_it_too(folders):
    """What a rollout's ``engines.launch`` uses: LaunchError (the rollout prints it) and no process spawned."""
    launcher = EngineLauncher(EngineLaunch(engine=EmbeddedEngineConfig(model=str(folders / "empty"))),
                              folders / "logs")
    with pytest.raises(LaunchError, match=r"has no config\.json"):
        asyncio.run(launcher.start())
    assert all(server.process is None for server in launcher.servers)


def test_model_and_set_model_conflict():
    result = runner.invoke(app, ["engine", "serve", "--model", "a", "--set", "model=b"])
    assert result.exit_code == 2 and result.output == "error: give the model once: --model or --set model=, not both\n"


def test_an_engine_without_a_model_field_says_so():
    result = runner.invoke(app, ["engine", "serve", "--adapter", "fake", "--model", "x"])
    assert result.exit_code == 2
    assert result.output == "error: fake engine config (--model): model: Extra inputs are not permitted\n"


def test_a_checkpoint_folder_passes(folders):
    (folders / "no-weights" / "model.safetensors").write_bytes(b"")
    check_model(VllmEngineConfig(model=str(folders / "no-weights")))
    check_model(FakeEngineConfig())  # no model to load
    with pytest.raises(ModelNotFoundError, match="no such folder"):
        check_model(VllmEngineConfig(model=str(folders / "gone")))
