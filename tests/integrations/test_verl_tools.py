"""verl's tool YAML (``class_name`` + ``config`` + ``tool_schema``) served by our tool server (verl 0.9.1 running for
real): a verl BaseTool runs out of process in ``agentloop tools serve``, reached over agentloop.v1 with its
per-trajectory lifecycle (create with ``create_kwargs``, execute, calc_reward, release); the pictures a verl tool
returns cross as the result's images."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

pytest.importorskip("verl", reason="verl is not installed (make setup installs it)")

import yaml
from pydantic import ValidationError
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

from agentloop_grpc.tools.client import GrpcToolClient
from agentloop_grpc.tools.config import VERL_ADAPTER, ToolServerConfig, build_tools, load_config
from agentloop_grpc.tools.result import ToolErrorKind
from agentloop_grpc.tools.server import create_tool_server

ROOT = Path(__file__).resolve().parents[2]


class AnswerTool(BaseTool):
    """A verl tool in the shape of verl's gsm8k tool: the ground truth comes with create_kwargs, each call records
    an answer, calc_reward scores the last one."""

    def __init__(self, config: dict, tool_schema) -> None:
        super().__init__(config, tool_schema)
        self._answers: dict[str, dict[str, Any]] = {}

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        self._answers[instance_id] = {"truth": truth, "answer": None}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        state = self._answers[instance_id]
        state["answer"] = str(parameters["answer"]).strip()
        reward = await self.calc_reward(instance_id)
        penalty = 0.0 if reward else self.config.get("wrong_answer_penalty", 0.0)
        return ToolResponse(text=f"answer={state['answer']} reward={reward}"), -penalty, {"reward": reward,
                                                                                            "note": "text"}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._answers[instance_id]
        return 1.0 if state["answer"] is not None and state["answer"] == state["truth"] else 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._answers[instance_id]


#: verl's tool YAML, as verl's ``tool_config_path`` points to it.
VERL_YAML = {
    "tools": [{
        "class_name": f"{__name__}.AnswerTool",
        "config": {"type": "native", "wrong_answer_penalty": 0.5},
        "tool_schema": {"type": "function", "function": {
            "name": "submit_answer",
            "description": "Submit the final answer to the question.",
            "parameters": {"type": "object", "required": ["answer"], "properties": {
                "answer": {"type": "string", "description": "The answer, a number.", "maxLength": 32}}},
        }},
    }],
}


def _write(tmp_path: Path, document: dict) -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_a_verl_tool_yaml_loads_as_our_config_next_to_our_tools(tmp_path: Path) -> None:
    mixed = {"tools": [*VERL_YAML["tools"], {"function": "agentloop_grpc.tools.builtin.calculator:calculator"}]}
    config = load_config(_write(tmp_path, mixed))
    verl_entry = config.tools[0]
    assert verl_entry.class_ == VERL_ADAPTER
    assert verl_entry.kwargs["class_name"] == f"{__name__}.AnswerTool"
    tools = build_tools(config)
    assert sorted(tools) == ["calculator", "submit_answer"]
    spec = tools["submit_answer"].spec
    assert spec.description == "Submit the final answer to the question."
    assert spec.parameters["properties"]["answer"]["maxLength"] == 32  # the YAML's schema, not verl's trimmed copy


def test_bad_verl_entries_are_refused_by_name() -> None:
    entry = VERL_YAML["tools"][0]
    with pytest.raises(ValidationError, match="unknown keys \\['kwargs'\\]"):
        ToolServerConfig.model_validate({"tools": [{**entry, "kwargs": {}}]})
    with pytest.raises(ValueError, match=r"config.type 'mcp' is not supported"):
        build_tools(ToolServerConfig.model_validate({"tools": [{**entry, "config": {"type": "mcp"}}]}))
    with pytest.raises(ValueError, match=r"not a subclass of verl.tools.base_tool.BaseTool"):
        build_tools(ToolServerConfig.model_validate({"tools": [{**entry, "class_name": "json.JSONDecoder"}]}))


async def test_a_verl_tool_runs_out_of_process_in_our_tool_server(tmp_path: Path) -> None:
    path = _write(tmp_path, VERL_YAML)
    server = subprocess.Popen([sys.executable, "-m", "agentloop_grpc.cli", "tools", "serve", "--config", str(path),
                               "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    client = None
    try:
        line = ""
        while "listening on" not in line:  # verl's BaseTool prints its schema first
            line = server.stdout.readline()
            assert line, "the tool server exited before listening"
        client = GrpcToolClient(line.split("listening on ", 1)[1].split()[0], timeout_s=60)
        [spec] = await client.list_tools()
        assert spec.name == "submit_answer" and spec.parameters["required"] == ["answer"]
        instance = await client.create_instance("submit_answer", "trajectory-1", {"ground_truth": "72"})
        wrong = await client.execute(instance, json.dumps({"answer": "71"}))
        assert (wrong.content, wrong.step_reward, wrong.is_error) == ("answer=71 reward=0.0", -0.5, False)
        assert wrong.metrics["reward"] == 0.0 and "note" not in wrong.metrics  # numbers only cross the wire
        assert (await client.calc_reward(instance)).reward == 0.0
        right = await client.execute(instance, json.dumps({"answer": "72"}))
        assert (right.content, right.step_reward) == ("answer=72 reward=1.0", 0.0)
        assert (await client.calc_reward(instance)).reward == 1.0
        refused = await client.execute(instance, json.dumps({"answer": 72}))  # the YAML's schema is enforced
        assert refused.error_kind is ToolErrorKind.INVALID_ARGUMENTS
        await client.release(instance)
    finally:
        if client is not None:
            await client.close()
        server.terminate()
        server.communicate(timeout=60)


@pytest.mark.fault
async def test_each_trajectory_s_verl_instance_keeps_its_own_state() -> None:
    """verl's tools key their state by the instance id ``create`` returns (a fresh uuid per CreateInstance, as our
    adapter passes none): one trajectory's ground truth and answers are not another's."""
    server = await create_tool_server(ToolServerConfig.model_validate(VERL_YAML))
    client = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=60)
    try:
        a = await client.create_instance("submit_answer", "A", {"ground_truth": "72"})
        b = await client.create_instance("submit_answer", "B", {"ground_truth": "5"})
        assert (await client.execute(a, json.dumps({"answer": "72"}))).content == "answer=72 reward=1.0"
        assert (await client.execute(b, json.dumps({"answer": "72"}))).content == "answer=72 reward=0.0"
        assert [(await client.calc_reward(i)).reward for i in (a, b)] == [1.0, 0.0]
        await client.release(a)
        c = await client.create_instance("submit_answer", "C", {"ground_truth": "72"})
        assert (await client.calc_reward(c)).reward == 0.0  # nothing of A's answer
        for instance in (b, c):
            await client.release(instance)
    finally:
        await client.close()
        await server.stop(grace_s=1)


class PictureTool(BaseTool):
    """A verl tool answering with pictures (a screenshot tool's shape), or with what ``parameters`` asks for."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        from PIL import Image

        red = Image.new("RGB", (6, 4), (255, 0, 0))
        jpeg = io.BytesIO()
        red.save(jpeg, format="JPEG")
        shown = {"pictures": [red, None, jpeg.getvalue()], "path": ["/tmp/red.png"]}.get(parameters.get("show"))
        if parameters.get("show") == "video":
            return ToolResponse(text="a clip", video=[b"frames"]), 0.0, {}
        return ToolResponse(text="the scene", image=shown), 0.0, {}


async def test_a_verl_tools_pictures_cross_our_tool_server_as_images() -> None:
    from PIL import Image

    entry = {"class_name": f"{__name__}.PictureTool", "config": {"type": "native"}, "tool_schema": {
        "type": "function", "function": {"name": "look", "description": "Look at the scene.", "parameters": {
            "type": "object", "properties": {"show": {"type": "string"}}, "required": ["show"]}}}}
    server = await create_tool_server(ToolServerConfig.model_validate({"tools": [entry]}))
    client = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=60)
    try:
        instance = await client.create_instance("look", "trajectory-1", {})
        shown = await client.execute(instance, json.dumps({"show": "pictures"}))
        path = await client.execute(instance, json.dumps({"show": "path"}))
        video = await client.execute(instance, json.dumps({"show": "video"}))
        await client.release(instance)
    finally:
        await client.close()
        await server.stop(grace_s=1)
    assert shown.content == "the scene" and not shown.is_error
    png, jpeg = shown.images  # verl's loop skips a None picture: so does the adapter
    assert (png.mime_type, jpeg.mime_type) == ("image/png", "image/jpeg")
    assert Image.open(io.BytesIO(png.data)).convert("RGB").tobytes() == Image.new("RGB", (6, 4), (255, 0, 0)).tobytes()
    assert path.error_kind is ToolErrorKind.EXCEPTION and path.content.startswith("look's image[0] is a str: ")
    assert video.error_kind is ToolErrorKind.EXCEPTION and "returned videos" in video.content
