"""ToolExecute over a real server: lifecycle, schema violations, tool errors vs infrastructure errors, TTL, limits."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop_grpc.tools.client import (
    GrpcToolClient,
    InProcessToolClient,
    ToolInfrastructureError,
    ToolRequestError,
    ToolServerOverloadedError,
)
from agentloop_grpc.tools.config import ToolServerConfig, build_tools, load_config
from agentloop_grpc.tools.instances import InstanceManager
from agentloop_grpc.tools.result import ToolErrorKind
from agentloop_grpc.tools.server import create_tool_server
from agentloop_grpc.v1 import tool_pb2

from .conftest import BUILTIN, children, tool_server


async def test_lists_the_three_builtins_as_openai_functions(tools) -> None:
    specs = {s.name: s for s in await tools.list_tools()}
    assert set(specs) == {"calculator", "check_answer", "python"}
    assert specs["calculator"].parameters["required"] == ["expression"]
    assert specs["calculator"].openai()["function"]["name"] == "calculator"
    assert "isolated" in specs["python"].description.lower()


async def test_python_instance_keeps_state_between_calls(tools) -> None:
    instance = await tools.create_instance("python", "traj-1")
    first = await tools.execute(instance, json.dumps({"code": "x = 6 * 7"}))
    assert not first.is_error and first.content == ""
    second = await tools.execute(instance, json.dumps({"code": "print('x is', x)\nx + 1"}))
    assert second.content == "x is 42\n43"
    other = await tools.create_instance("python", "traj-2")
    isolated = await tools.execute(other, json.dumps({"code": "x"}))
    assert isolated.error_kind is ToolErrorKind.EXCEPTION and "NameError" in isolated.content
    await tools.release(instance)
    await tools.release(instance)  # idempotent
    await tools.release(other)


async def test_calculator_and_check_answer_reward(tools) -> None:
    calc = await tools.create_instance("calculator", "t")
    assert (await tools.execute(calc, json.dumps({"expression": "(17 + 23) * 3"}))).content == "120"
    broken = await tools.execute(calc, json.dumps({"expression": "1 / 0"}))
    assert broken.error_kind is ToolErrorKind.EXCEPTION and "ZeroDivisionError" in broken.content
    check = await tools.create_instance("check_answer", "t", {"ground_truth": "120"})
    assert (await tools.calc_reward(check)).reward == 0.0
    wrong = await tools.execute(check, json.dumps({"answer": "119"}))
    assert wrong.content == "Incorrect." and wrong.step_reward == 0.0
    right = await tools.execute(check, json.dumps({"answer": "120."}))
    assert right.content == "Correct." and right.step_reward == 1.0
    assert (await tools.calc_reward(check)).reward == 1.0


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [({}, "'expression' is a required property"), ({"expression": 5}, "is not of type 'string'"),
     ({"expression": "1", "extra": 1}, "Additional properties")],
)
async def test_schema_violations_are_tool_errors_the_model_reads(tools, arguments, needle) -> None:
    calc = await tools.create_instance("calculator", "t")
    result = await tools.execute(calc, json.dumps(arguments))
    assert result.error_kind is ToolErrorKind.INVALID_ARGUMENTS and needle in result.content


async def test_caller_errors_and_lost_instances_are_told_apart(tools) -> None:
    with pytest.raises(ToolRequestError, match=r"NOT_FOUND.*no tool named 'nope'"):
        await tools.create_instance("nope", "t")
    with pytest.raises(ToolRequestError, match="ground_truth"):
        await tools.create_instance("check_answer", "t", {})
    calc = await tools.create_instance("calculator", "t")
    with pytest.raises(ToolRequestError, match=r"INVALID_ARGUMENT.*not JSON"):
        await tools.execute(calc, "{not json")
    await tools.release(calc)
    with pytest.raises(ToolInfrastructureError, match="NOT_FOUND"):
        await tools.execute(calc, json.dumps({"expression": "1"}))


async def test_idle_instances_are_released_after_ttl() -> None:
    async with tool_server(instance_ttl_s=0.2) as (server, client):
        instance = await client.create_instance("calculator", "t")
        assert server.instances.live_instances == 1
        await asyncio.sleep(0.6)
        assert server.instances.live_instances == 0
        with pytest.raises(ToolInfrastructureError, match="expired"):
            await client.execute(instance, json.dumps({"expression": "1"}))


async def test_the_instance_limit_answers_resource_exhausted_which_lasting_to_the_deadline_is_overload() -> None:
    """(The execution queue's limits are in test_tool_bursts.py.)"""
    async with tool_server(max_instances=2) as (server, client):
        impatient = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=1)
        try:
            await client.create_instance("python", "t")
            calc = await client.create_instance("calculator", "t")
            with pytest.raises(ToolServerOverloadedError, match=r"(?s)CreateInstance.*RESOURCE_EXHAUSTED.*instances"):
                await impatient.create_instance("calculator", "t")
            await client.release(calc)
            assert await impatient.create_instance("calculator", "t")  # a freed place is taken
        finally:
            await impatient.close()


async def test_in_process_client_has_the_same_interface_and_close_stops_its_workers() -> None:
    def workers() -> set[int]:
        return children("agentloop_grpc.tools.workers")

    before = workers()
    client = InProcessToolClient(InstanceManager(build_tools(load_config(BUILTIN))))
    calc = await client.create_instance("calculator", "t")
    assert (await client.execute(calc, json.dumps({"expression": "2 + 2"}))).content == "4"
    assert {s.name for s in await client.list_tools()} == {"calculator", "check_answer", "python"}
    assert workers() - before  # the calculator ran in a worker process
    await client.close()
    assert not workers() - before


async def test_images_cross_the_contract() -> None:
    config = ToolServerConfig.model_validate({"tools": [{"function": "tests.tools.image_tool:plot"}]})
    server = await create_tool_server(config, "127.0.0.1:0")
    client = GrpcToolClient(f"127.0.0.1:{server.port}")
    try:
        instance = await client.create_instance("plot", "t")
        result = await client.execute(instance, json.dumps({"title": "loss"}))
        assert result.content == "plotted loss"
        assert [(i.mime_type, i.data) for i in result.images] == [("image/png", b"\x89PNG\r\n\x1a\nloss")]
    finally:
        await client.close()
        await server.stop(grace_s=1)


DEEP = 100_000


@pytest.mark.parametrize(
    ("arguments_json", "needle"),
    [("[" * 5_000 + "]" * 5_000, "nest"), ('{"expression": ' + "[" * DEEP + "]" * DEEP + "}", "nest"),
     ('{"expression": ' + "1" * 5_000 + "}", "4300 digits")],
    ids=["5000-deep", "100000-deep", "5000-digits"],
)
@pytest.mark.fault
async def test_arguments_past_the_json_decoders_limits_are_invalid_argument(tools, arguments_json, needle) -> None:
    """Python's recursion and int-digit limits escaped the decoder as INTERNAL, which the client reports as an
    infrastructure failure; they are bad model output, like any other JSON that does not parse."""
    calc = await tools.create_instance("calculator", "t")
    with pytest.raises(ToolRequestError, match=f"INVALID_ARGUMENT.*arguments_json.*{needle}") as raised:
        await tools.execute(calc, arguments_json)
    assert len(str(raised.value)) < 500
    with pytest.raises(ToolRequestError, match=f"INVALID_ARGUMENT.*create_kwargs_json.*{needle}"):
        await tools._call("CreateInstance", tool_pb2.CreateInstanceRequest(
            tool_name="check_answer", trajectory_id="t", create_kwargs_json=arguments_json))


@pytest.mark.fault
async def test_schema_violations_quote_a_bounded_prefix_of_the_arguments(tools) -> None:
    calc = await tools.create_instance("calculator", "t")
    for value in ("[" * 900 + "]" * 900, json.dumps(["x" * 100] * 1000)):
        result = await tools.execute(calc, '{"expression": ' + value + "}")
        assert result.error_kind is ToolErrorKind.INVALID_ARGUMENTS and "is not of type 'string'" in result.content
        assert len(result.content) < 1000


@pytest.mark.fault
async def test_ids_over_the_bound_are_invalid_argument_and_not_echoed(tools) -> None:
    huge = "x" * 100_000
    calls = {"tool_name": tools.create_instance(huge, "t"), "trajectory_id": tools.create_instance("calculator", huge),
             "instance_id": tools.execute(huge, "{}")}
    for field, call in calls.items():
        with pytest.raises(ToolRequestError, match=f"INVALID_ARGUMENT.*{field} is 100000 bytes.*256") as raised:
            await call
        assert len(str(raised.value)) < 500
    for call in (tools.calc_reward(huge), tools.release(huge)):
        with pytest.raises(ToolRequestError, match=r"INVALID_ARGUMENT.*instance_id is 100000 bytes"):
            await call


@pytest.mark.fault
async def test_a_call_burning_cpu_stalls_neither_health_nor_other_calls() -> None:
    """A function tool ran in a thread of the server: one C call holding the GIL (a huge integer power) froze
    Health and every other trajectory's calls until it finished. The call is also bounded by its time limit."""
    config = ToolServerConfig.model_validate(
        {"tools": [{"function": "tests.tools.spin_tool:spin"},
                   {"function": "agentloop_grpc.tools.builtin.calculator:calculator"}],
         "limits": {"function_timeout_s": 3}}
    )
    server = await create_tool_server(config, "127.0.0.1:0")
    client = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=60)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        spinner = await client.create_instance("spin", "burning")
        calc = await client.create_instance("calculator", "other")
        started = time.monotonic()
        burning = asyncio.create_task(client.execute(spinner, json.dumps({"seconds": 30})))
        await asyncio.sleep(1.0)  # measured from before: a stalled server stalls this process's loop too
        stub = health_pb2_grpc.HealthStub(channel)
        health = await stub.Check(health_pb2.HealthCheckRequest(), timeout=60)  # type: ignore[attr-defined]  # typeshed's HealthStub declares no methods
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert time.monotonic() - started < 6
        assert (await client.execute(calc, json.dumps({"expression": "6 * 7"}))).content == "42"
        assert time.monotonic() - started < 12
        result = await burning
        assert result.error_kind is ToolErrorKind.TIMEOUT
        assert result.content == "spin ran longer than 3 s and was stopped"
        assert time.monotonic() - started < 15
    finally:
        await channel.close()
        await client.close()
        await server.stop(grace_s=1)


@pytest.mark.fault
async def test_an_unisolated_python_tool_removes_its_folders_when_closed(monkeypatch) -> None:
    """Where bwrap cannot run, sessions work in host folders: the tool's close (at server stop) removes them."""
    from agentloop_grpc.tools.builtin import python_tool

    monkeypatch.setattr(python_tool, "probe_isolation", lambda: "bwrap is missing (test)")
    tool = python_tool.PythonTool(wall_timeout_s=5)
    session = await tool.create("t", {})
    result = await tool.execute(session, {"code": "import os\nopen('kept.txt', 'w').write('x')\nos.listdir('.')"})
    assert result.content == "['kept.txt']" and session.workdir.parent.name.startswith("agentloop-sandboxes-")
    root = session.workdir.parent
    await tool.release(session)
    await tool.close()
    assert not root.exists()
