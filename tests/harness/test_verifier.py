"""The reward of a coding trajectory: the generated tasks' hidden tests, in a fresh sandbox on what the agent left
(pass rate, all-pass, a timeout scoring 0), and the reward read as Harbor writes it (reward.txt, reward.json, the
exit code)."""

from __future__ import annotations

import shutil

import pytest

from agentloop_grpc.common.jail import probe_cached
from agentloop_grpc.harness.generated_tasks import PACKAGES, fixed_source, generate_tasks
from agentloop_grpc.harness.task import CodingTask, TaskError, find_tasks
from agentloop_grpc.harness.verifier import verify

pytestmark = pytest.mark.skipif(probe_cached() is not None, reason=f"no sandbox here: {probe_cached()}")


def test_the_generated_set_is_what_its_seed_says_and_loads_as_tasks(tmp_path):
    first, again = generate_tasks(tmp_path / "a", 20, seed=3), generate_tasks(tmp_path / "b", 20, seed=3)
    assert [p.name for p in first] == [p.name for p in again] and len({p.name for p in first}) == 20
    tasks = find_tasks(tmp_path / "a")
    assert len(tasks) == 20 and all(t.repo is not None and t.solution is not None for t in tasks)
    assert {t.name.split("-")[1] for t in tasks} <= set(PACKAGES)
    assert tasks[0].agent_timeout_s == 300.0 and tasks[0].verifier_timeout_s == 60.0
    with pytest.raises(TaskError, match=r"no instruction\.md"):
        CodingTask.load(tmp_path)


async def test_the_hidden_tests_score_the_final_workspace(tmp_path):
    task = CodingTask.load(generate_tasks(tmp_path / "tasks", 1)[0])
    assert task.repo is not None
    final = tmp_path / "final"
    shutil.copytree(task.repo, final)
    buggy = await verify(task, final, tmp_path / "ws")
    assert (buggy.source, buggy.passed, buggy.failed) == ("junit", 1, 2) and buggy.reward == pytest.approx(1 / 3)
    assert (await verify(task, final, tmp_path / "ws", "all_pass")).reward == 0.0
    module, source = fixed_source(task.folder)
    (final / module).write_text(source)
    fixed = await verify(task, final, tmp_path / "ws", "all_pass")
    assert (fixed.reward, fixed.passed, fixed.failed) == (1.0, 3, 0)


@pytest.mark.parametrize(("script", "reward", "source"), [
    ("echo 0.75 > /logs/verifier/reward.txt", 0.75, "reward_file"),
    ('echo \'{"reward": 0.5}\' > /logs/verifier/reward.json', 0.5, "reward_file"),
    ("exit 0", 1.0, "exit_code"),
    ("exit 1", 0.0, "exit_code"),
    ("sleep 30", 0.0, "timeout"),
])
async def test_the_reward_is_read_as_harbor_writes_it_and_a_timeout_scores_zero(tmp_path, script, reward, source):
    folder = tmp_path / "task"
    (folder / "tests").mkdir(parents=True)
    (folder / "instruction.md").write_text("Do it.")
    (folder / "task.toml").write_text("[verifier]\ntimeout_sec = 1.0\n")
    (folder / "tests" / "test.sh").write_text(f"#!/usr/bin/env bash\n{script}\n")
    (tmp_path / "final").mkdir()
    verdict = await verify(CodingTask.load(folder), tmp_path / "final", tmp_path / "ws")
    assert (verdict.reward, verdict.source) == (reward, source)
