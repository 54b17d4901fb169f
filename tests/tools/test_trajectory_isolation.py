"""One trajectory cannot read another's state, for each kind of tool that keeps state per instance (docs/tools.md,
"What is isolated"): the python tool sandboxed (variables, /work, /tmp) and unsandboxed (variables, its folder as
working directory, HOME and TMPDIR; as root, its folder closed to other sessions' uids), and a class tool
(check_answer: the ground truth and answer of each instance). MCP servers: test_mcp_isolation.py; verl tools:
tests/integrations/test_verl_tools.py."""

from __future__ import annotations

import json
import os

import pytest

from agentloop_grpc.tools.builtin import python_tool
from agentloop_grpc.tools.builtin.check_answer import CheckAnswer
from agentloop_grpc.tools.client import GrpcToolClient
from agentloop_grpc.tools.sandbox import probe_isolation


async def run(client: GrpcToolClient, instance: str, code: str) -> str:
    return (await client.execute(instance, json.dumps({"code": code}))).content


@pytest.mark.skipif(probe_isolation() is not None, reason=f"sandbox isolation unavailable: {probe_isolation()}")
@pytest.mark.fault
async def test_a_sandboxed_python_session_sees_nothing_of_another(tools: GrpcToolClient) -> None:
    a = await tools.create_instance("python", "A")
    b = await tools.create_instance("python", "B")
    await run(tools, a, "secret = 42\nopen('/work/answer', 'w').write('42')\nopen('/tmp/answer', 'w').write('42')\n"
                        "import os\nos.makedirs(os.path.expanduser('~/.cache'), exist_ok=True)")
    assert await run(tools, a, "secret, open('/work/answer').read(), open('/tmp/answer').read()") == \
        "(42, '42', '42')"
    seen = await run(tools, b, "import os\n'secret' in globals(), os.listdir('/work'), os.listdir('/tmp'), "
                               "os.path.expanduser('~')")
    assert seen == "(False, [], [], '/work')"
    await tools.release(a)
    c = await tools.create_instance("python", "C")  # after A: nothing of it either
    assert await run(tools, c, "import os\nos.listdir('/work'), os.listdir('/tmp')") == "([], [])"
    for instance in (b, c):
        await tools.release(instance)


@pytest.mark.fault
async def test_an_unsandboxed_python_session_keeps_its_files_in_its_own_folder(monkeypatch) -> None:
    """Where bwrap cannot run, a session still works in a folder of its own, which is its HOME and TMPDIR; run as
    root, each session has a uid of its own and its folder (0700) is closed to the others."""
    monkeypatch.setattr(python_tool, "probe_isolation", lambda: "bwrap is missing (test)")
    tool = python_tool.PythonTool(wall_timeout_s=10)
    a, b = await tool.create("A", {}), await tool.create("B", {})
    try:
        wrote = await tool.execute(a, {"code": "import os, tempfile\nsecret = 42\nopen('answer', 'w').write('42')\n"
                                               "print(tempfile.gettempdir() == os.getcwd() == os.path.expanduser('~'))"
                                               "\nos.getcwd()"})
        assert wrote.content.startswith("True") and repr(str(a.workdir)) in wrote.content
        seen = await tool.execute(b, {"code": "import os, tempfile\n'secret' in globals(), os.listdir('.'), "
                                              "tempfile.gettempdir() == os.getcwd()"})
        assert seen.content == "(False, [], True)"
        reach = await tool.execute(b, {"code": f"open({str(a.workdir / 'answer')!r}).read()"})
        if os.geteuid() == 0:  # each session its uid: A's folder is closed to B
            assert reach.is_error and "PermissionError" in reach.content
        else:  # one uid for all: the folder is reachable by its path, as the tool's description warns
            assert reach.content == "'42'"
    finally:
        for session in (a, b):
            await tool.release(session)
        await tool.close()


@pytest.mark.fault
async def test_check_answer_instances_keep_their_own_ground_truth_and_answer() -> None:
    tool = CheckAnswer()
    a = await tool.create("A", {"ground_truth": "42"})
    b = await tool.create("B", {"ground_truth": "7"})
    assert (await tool.execute(a, {"answer": "42"})).content == "Correct."
    assert (await tool.execute(b, {"answer": "42"})).content == "Incorrect."  # A's truth is not B's
    assert ((await tool.reward(a)).reward, (await tool.reward(b)).reward) == (1.0, 0.0)
    assert (await tool.reward(await tool.create("C", {"ground_truth": "42"}))).reward == 0.0  # A's answer neither
