"""A loop of a user's own (``custom_loops.ReviseLoop``, outside the package) named by import path in a WorkerSpec
reaches every sample that asks for it, with its own config, in process and in Ray actors; bad specs are refused
with the field named. Ray's actors import the module as the driver does: a local Ray starts its workers in the
driver's working directory (the repository root under pytest)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
from pydantic import ValidationError

from agentloop_grpc.agent import AgentLoopManager, ComponentSpec, Sample, Termination, WorkerSpec

from ..ray_start import init_ray
from .conftest import TextScript, scripted_engine
from .custom_loops import PATH

QUESTION = ({"role": "user", "content": "What is 2 + 3?"},)
FOLLOW_UP = "Are you sure? Check it once more."


def _revise(**kwargs) -> dict[str, ComponentSpec]:
    return {"revise": ComponentSpec(path=PATH, kwargs={"follow_up": FOLLOW_UP, **kwargs})}


@pytest.mark.slow
@pytest.mark.parametrize(("use_ray", "workers"), [(False, 2), (True, 1)], ids=["in-process", "ray"])
async def test_a_custom_loop_runs_with_its_own_config_beside_the_built_in_ones(codec, use_ray, workers):
    if use_ray:
        # as the manager would, with a second try; 4 CPUs, what the verl replica tests need, so later suites
        # reuse this Ray instead of restarting it
        init_ray(num_cpus=4, include_dashboard=False, log_to_driver=False)
    script = TextScript(codec, ["It is 5.", "Yes, 5.", "Still 5."])
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(scripted_engine(script))
        spec = WorkerSpec(engines=(engine,), loops=_revise(rounds=2))
        manager = await stack.enter_async_context(AgentLoopManager(spec, num_workers=workers, use_ray=use_ray))
        samples = [Sample(sample_id=f"r{i}", messages=QUESTION, loop="revise") for i in range(3)]
        samples += [Sample(sample_id="plain", messages=QUESTION, loop="single_turn"),
                    Sample(sample_id="typo", messages=QUESTION, loop="revize")]
        batch = await manager.generate(samples)
    by_id = {t.sample_id: t for t in batch.trajectories}
    for i in range(3):
        revised = by_id[f"r{i}"]
        assert not revised.failed and revised.termination is Termination.STOP and revised.loop == "revise"
        # rounds=2: three answers, the follow-up (its own config) heard twice, all of it token-exact
        assert [m["content"] for m in revised.messages if m["role"] == "assistant"] == [
            "It is 5.", "Yes, 5.", "Still 5."]
        assert [m["content"] for m in revised.messages if m["role"] == "user"][1:] == [FOLLOW_UP] * 2
        assert revised.assistant_turns == 3 and revised.user_turns == 2 and revised.drift is None
    assert any(FOLLOW_UP in codec.decode(r.prompt_ids) for r in script.requests)  # the engine saw the follow-up
    plain = by_id["plain"]
    assert not plain.failed and plain.loop == "single_turn" and plain.assistant_turns == 1
    typo = by_id["typo"]
    assert typo.failed and "no loop named 'revize'; known: ['revise', 'single_turn', 'tool']" in typo.error


def test_a_custom_loop_may_not_take_a_built_in_name():
    with pytest.raises(ValidationError, match=r"loops\n.*\['tool'\] are built-in loop names"):
        WorkerSpec(loops={"tool": ComponentSpec(path=PATH, kwargs={"follow_up": FOLLOW_UP})})


@pytest.mark.parametrize(
    ("loops", "expected"),
    [
        ({"bad": ComponentSpec(path="tests.agent.no_such_module:Loop")},
         "loops.bad: tests.agent.no_such_module:Loop could not be built (ModuleNotFoundError"),
        ({"bad": ComponentSpec(path="tests.agent.custom_loops:NoRun")},
         "loops.bad: tests.agent.custom_loops:NoRun gave a NoRun, which has no async run(sample) method"),
        (_revise(turns=2), "loops.revise: tests.agent.custom_loops:ReviseLoop could not be built (TypeError"),
    ],
    ids=["missing-module", "not-a-loop", "unknown-kwarg"],
)
async def test_a_bad_custom_loop_fails_the_worker_naming_the_loop(codec, loops, expected):
    script = TextScript(codec, ["5"])
    async with scripted_engine(script) as engine:
        manager = AgentLoopManager(WorkerSpec(engines=(engine,), loops=loops))
        with pytest.raises(ValueError) as raised:
            await manager.start()
        await manager.close()
    assert expected in str(raised.value)
