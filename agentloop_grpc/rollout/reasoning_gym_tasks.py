"""reasoning-gym's procedural tasks (the ``reasoning-gym`` extra) as dataset rows: ``dataset.reasoning_gym``.

A task is one of reasoning-gym's datasets, built as ``reasoning_gym.create_dataset(task, size=, seed=, **config)``;
its entries are generated from the seed and their index, so nothing is downloaded. A row is a system message (the
instruction to answer between ``<answer>`` and ``</answer>``, reasoning-gym's own convention), optionally a few
worked examples of the same task, and the entry's question, run by the single_turn loop.

The row's ground truth names its entry as JSON, ``{"task", "size", "seed", "config", "index", "answer"}``: the
reward (``reasoning_gym_reward.py``) rebuilds the dataset and the entry from it in whatever process scores (a Ray
worker, the trainer, the session gateway), so the task's scorer gets the very object the task generated, its
metadata's Python types intact (a JSON copy of an entry would turn tuples into lists and integer keys into
strings). ``answer`` is the entry's answer (null for tasks with many right answers): the reward checks the rebuilt
entry against it, so a different reasoning-gym version in that process fails loudly instead of scoring against
another problem.

reasoning-gym is imported by this module and the reward only, and only when a config names the source.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: The system message of every row unless the config gives one: what the reward reads is the last
#: ``<answer>...</answer>`` of the reply (reasoning_gym.utils.extract_answer).
INSTRUCTION = (
    "Solve the problem. Write your final answer between <answer> and </answer>, with nothing else inside the "
    "tags, for example <answer>42</answer>."
)

#: The fields of every task's config that the source sets itself (size and seed of ``dataset.reasoning_gym``).
_OWN_FIELDS = frozenset({"size", "seed"})


@dataclass(frozen=True, slots=True)
class TaskRef:
    """One reasoning-gym dataset, as the config names it: enough to build it again anywhere."""

    task: str
    size: int
    seed: int
    config: dict[str, Any]

    def build(self) -> Any:
        """The ``ProceduralDataset`` (reasoning-gym's errors propagate: the config check has run them first)."""
        import reasoning_gym

        return reasoning_gym.create_dataset(self.task, size=self.size, seed=self.seed, **self.config)


def _registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's datasets by name (their dataset and config classes); ValueError naming the extra when the
    package is not installed (a config error, not a traceback)."""
    try:
        from reasoning_gym.factory import DATASETS
    except ModuleNotFoundError as error:
        raise ValueError(f"needs `pip install 'agentloop-grpc[reasoning-gym]'` (module {error.name!r} is not "
                         "installed)") from None
    return DATASETS


def check_task(task: str) -> str:
    """``task`` when reasoning-gym has a dataset of that name; ValueError naming the closest ones otherwise."""
    names = _registry()
    if task not in names:
        close = difflib.get_close_matches(task, sorted(names), n=3)
        hint = f"did you mean {' or '.join(close)}?" if close else "reasoning_gym.factory.DATASETS lists them"
        raise ValueError(f"reasoning-gym has no task {task!r} ({hint})")
    return task


def check_config(ref: TaskRef) -> dict[str, Any]:
    """``ref.config`` when the task's config class takes it and reasoning-gym builds the dataset from it;
    ValueError saying which key or value it refused otherwise."""
    config_class = _registry()[ref.task][1]
    fields = sorted({f.name for f in dataclasses.fields(config_class)} - _OWN_FIELDS)
    for key in ref.config:
        if key in _OWN_FIELDS:
            raise ValueError(f"{key!r} is set by dataset.reasoning_gym.{key}, not inside config")
        if key not in fields:
            raise ValueError(f"{config_class.__name__} has no field {key!r}; its fields: {', '.join(fields)}")
    try:
        ref.build()[0]  # some configs pass the task's checks and fail only when an entry is generated
    except Exception as error:  # noqa: BLE001 - a task's checks are asserts, its generator may raise anything
        raise ValueError(f"reasoning-gym refused it for {ref.task} ({type(error).__name__}: {error})") from None
    return ref.config


def ground_truth(ref: TaskRef, index: int, answer: str | None) -> str:
    """The ground truth of entry ``index`` of ``ref``'s dataset (the JSON of the module docstring)."""
    return json.dumps({"task": ref.task, "size": ref.size, "seed": ref.seed, "config": ref.config,
                       "index": index, "answer": answer}, sort_keys=True)


def entry_of(truth: str | None) -> tuple[TaskRef, int, str | None]:
    """(dataset, index, answer) named by a row's ground truth; ValueError when it is not one of these rows'."""
    try:
        named = json.loads(truth or "")
        return (TaskRef(str(named["task"]), int(named["size"]), int(named["seed"]), dict(named["config"])),
                int(named["index"]), named["answer"])
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"the ground truth {str(truth)[:80]!r} names no reasoning-gym entry ({error}); rows of "
                         "dataset.reasoning_gym carry one") from None


def dataset_rows(ref: TaskRef, system_prompt: str | None = None, shots: int = 0) -> list[dict]:
    """The rows of ``ref``'s dataset (see rollout/dataset.py), one per distinct question in index order: a task
    with few possible problems repeats questions, and a repeated prompt would be a second GRPO group of the same
    problem (TRL finds rows by their prompt, so it refuses two rows with one prompt). ``shots``: worked examples
    before each question (``shot_messages``). ValueError when an entry cannot be generated or the shots cannot be
    found."""
    entries = list(_entries(ref, range(ref.size)))
    questions = {entry["question"] for _, entry in entries}
    system = INSTRUCTION if system_prompt is None else system_prompt
    prefix = [{"role": "system", "content": system}, *shot_messages(ref, shots, questions)]
    rows, seen = [], set()
    for index, entry in entries:
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        rows.append({
            "id": f"rg-{ref.task}-{ref.seed}-{index}",
            "messages": [*prefix, {"role": "user", "content": entry["question"]}],
            "ground_truth": ground_truth(ref, index, entry["answer"]),
            "loop": "single_turn",
        })
    return rows


def shot_messages(ref: TaskRef, shots: int, questions: set[str]) -> list[dict]:
    """``shots`` worked examples as user and assistant turns (the answer between the tags, as the reward wants
    it): distinct entries of the task under another seed, none of them one of the rows' ``questions`` (the model
    must not be shown its own problem solved). A small model that ignores the instruction alone copies the format
    from them."""
    if shots == 0:
        return []
    # seed + size: reasoning-gym seeds entry i with seed + i, so these are the entries after the rows' ones
    pool = TaskRef(ref.task, ref.size + shots, ref.seed + ref.size, ref.config)
    chosen: list[dict] = []
    for _, entry in _entries(pool, range(pool.size)):
        if entry["answer"] is None:
            raise ValueError(f"dataset.reasoning_gym.shots: {ref.task}'s entries have no single answer to show")
        if entry["question"] not in questions and all(entry["question"] != e["question"] for e in chosen):
            chosen.append(entry)
            if len(chosen) == shots:
                return [message for e in chosen for message in (
                    {"role": "user", "content": e["question"]},
                    {"role": "assistant", "content": f"<answer>{e['answer']}</answer>"})]
    raise ValueError(f"dataset.reasoning_gym.shots: {ref.task} under this config has too few distinct problems "
                     f"besides the rows' for {shots} examples")


def _entries(ref: TaskRef, indices: range) -> Iterator[tuple[int, dict]]:
    """(index, entry) of ``ref``'s dataset, generated as they are read; ValueError naming the entry a task's
    generator failed on."""
    dataset = ref.build()
    for index in indices:
        try:
            entry = dataset[index]
        except Exception as error:  # noqa: BLE001 - the config check generated entry 0 only
            raise ValueError(f"dataset.reasoning_gym: reasoning-gym could not generate entry {index} of {ref.task} "
                             f"({type(error).__name__}: {error})") from None
        yield index, entry
