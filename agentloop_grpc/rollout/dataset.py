"""Dataset rows -> Samples: JSONL or Parquet files, the generated arithmetic task, or a reasoning-gym task;
``samples_per_prompt`` copies of each prompt share a group id (GRPO).

A message's content may be a list of text and image parts (agent/images.py); an image part's relative file path is
relative to the dataset file. The pictures are read by the loop, so a missing or broken one fails its sample alone.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from agentloop_grpc.agent.row_sample import row_sample
from agentloop_grpc.agent.sample import Sample

from . import arithmetic
from .config import Dataset


class DatasetError(ValueError):
    """The dataset cannot be read or a row is malformed (the message names the file and row)."""


def read_rows(dataset: Dataset) -> list[dict]:
    if dataset.arithmetic is not None:
        task = dataset.arithmetic
        rows = arithmetic.dataset_rows(task.count, task.seed, task.kind, task.operations, task.max_operand)
    elif dataset.reasoning_gym is not None:
        from . import reasoning_gym_tasks

        gym = dataset.reasoning_gym
        try:
            rows = reasoning_gym_tasks.dataset_rows(
                reasoning_gym_tasks.TaskRef(gym.task, gym.size, gym.seed, gym.config), gym.system_prompt, gym.shots)
        except ValueError as error:
            raise DatasetError(str(error)) from None
    elif dataset.coding_tasks is not None:
        rows = _coding_task_rows(dataset)
    elif dataset.verifiers is not None:
        from agentloop_grpc.integrations.verifiers.environment import VerifiersError, environment_rows

        try:
            return environment_rows(dataset.verifiers, dataset.limit)
        except VerifiersError as error:
            raise DatasetError(f"dataset.verifiers: {error}") from None
    else:
        path = Path(dataset.path)
        if not path.is_file():
            raise DatasetError(f"dataset file {path} does not exist")
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            rows = pq.read_table(path).to_pylist()
        elif path.suffix in (".jsonl", ".json"):
            rows = []
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as error:
                        raise DatasetError(f"{path}:{number} is not JSON ({error.msg})") from None
        else:
            raise DatasetError(f"dataset file {path} must be .jsonl or .parquet")
    return rows[: dataset.limit] if dataset.limit else rows


def _coding_task_rows(dataset: Dataset) -> list[dict]:
    """One row per task: its instruction as the prompt, its folder under ``task`` (what the harness plays)."""
    import tempfile

    from agentloop_grpc.harness.generated_tasks import generate_tasks
    from agentloop_grpc.harness.task import TaskError, find_tasks

    source = dataset.coding_tasks
    assert source is not None
    if source.generated is not None:
        # the same count and seed write the same files: runs may share the folder
        folder = Path(tempfile.gettempdir()) / f"agentloop-coding-tasks-{source.generated}-{source.seed}"
        generate_tasks(folder, source.generated, source.seed)
    else:
        folder = Path(source.path or "")
    try:
        tasks = find_tasks(folder)
    except (TaskError, OSError) as error:
        raise DatasetError(f"dataset.coding_tasks: {error}") from None
    return [{"id": t.name, "messages": [{"role": "user", "content": t.instruction}], "task": str(t.folder)}
            for t in tasks]


def to_samples(rows: list[dict], dataset: Dataset, samples_per_prompt: int) -> list[Sample]:
    samples = []
    base_dir = Path(dataset.path).resolve().parent if dataset.path else None
    for index, row in enumerate(rows):
        prompt_id = str(row.get("id", f"row-{index}"))
        for k in range(samples_per_prompt):
            try:
                samples.append(row_sample(row, f"{prompt_id}/{k}", prompt_id, dataset.default_loop,
                                          dataset.ground_truth_kwargs, base_dir))
            except (KeyError, TypeError, ValidationError) as error:
                detail = f"missing {error}" if isinstance(error, KeyError) else str(error).splitlines()[-1].strip()
                raise DatasetError(f"dataset row {index} ({prompt_id}): {detail}") from None
    return samples
