"""Loading a verifiers environment for a run, and its tasks as dataset rows.

``load_environment`` builds the ``vf.Env`` verifiers would build for ``vf eval <env>`` with the config's ``args``,
with two defaults of this run (the seat's runtime is subprocess; a subprocess harness program installs offline,
offline.py) and refuses, before any server starts, what cannot give trajectories of this run's model:

- an environment of several seats (a multi-agent env): its seats' turns would be chains of one session, and the
  reward is the episode's, not a seat's;
- a seat with its own ``client`` or ``model``: its calls would bypass the gateway and record nothing;
- ``retries`` (the env's or the seat's): a retried episode's failed attempt would stay in its session.

A row is a task's wire data (``verifiers_task``, what verifiers' own env server ships to its workers) beside its
prompt as chat messages: the task is rebuilt from it where it is played, so a taskset need not load the same tasks
twice.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from .config import VerifiersEnvironment
from .offline import OfflineHarnessError, harness_environment

if TYPE_CHECKING:
    from verifiers.v1 import Env, Task

#: The row field holding a task's wire data.
TASK_FIELD = "verifiers_task"


class VerifiersError(ValueError):
    """The environment cannot be loaded or played by this run: the sentence says why."""


def load_environment(config: VerifiersEnvironment) -> Env:
    """The environment, its refusals checked (VerifiersError)."""
    try:
        import verifiers.v1 as vf
        from verifiers.v1.configs.agent import agent_config_fields
    except ImportError as error:
        raise VerifiersError(f"verifiers environments need the 'verifiers' extra (make setup installs it): "
                             f"{error}") from None
    raw: dict[str, Any] = {**config.args, "taskset": {**(config.args.get("taskset") or {}), "id": config.env}}

    def resolved() -> Any:
        return vf.resolve_env_config(copy.deepcopy(raw))  # verifiers' validators rewrite the dict they are given

    try:
        seats = agent_config_fields(resolved())
        if len(seats) != 1:
            raise VerifiersError(f"{config.env}: an environment of {len(seats)} seats ({', '.join(seats)}) is "
                                 f"refused: one session holds one seat's turns, and its reward is the episode's")
        (seat,) = seats
        given = dict(raw.get(seat) or {})
        for key in ("client", "model"):
            if given.get(key):
                raise VerifiersError(f"args.{seat}.{key}: the seat's model calls go to this run's gateway (a "
                                     f"{key} of its own would record no trajectory)")
        if (given.get("retries") or {}).get("max_retries"):
            raise VerifiersError(f"args.{seat}.retries: a retried attempt would stay in its session; refused")
        raw[seat] = _local_seat(given, resolved().agent_harnesses()[seat], config.harness_wheels)
        return vf.load_environment(resolved())
    except VerifiersError:
        raise
    except OfflineHarnessError as error:
        raise VerifiersError(str(error)) from None
    except Exception as error:  # noqa: BLE001 - an environment's package may raise anything as it loads
        raise VerifiersError(f"the verifiers environment {config.env!r} cannot be loaded "
                             f"({type(error).__name__}: {_first_line(error)})") from None


def _local_seat(seat: dict[str, Any], harness: Any, wheels: str | None) -> dict[str, Any]:
    """The seat with the run's defaults: a subprocess runtime unless given, its uv-script program offline there."""
    runtime = seat.get("runtime") or {"type": "subprocess"}
    if runtime.get("type") != "subprocess":
        return {**seat, "runtime": runtime}
    given = harness.model_dump()
    return {**seat, "runtime": runtime, "harness": {**given, "env": {**harness_environment(wheels), **given["env"]}}}


def environment_rows(config: VerifiersEnvironment, limit: int | None = None) -> list[dict[str, Any]]:
    """The taskset's first ``limit`` tasks (all: None) as rows (VerifiersError when a task cannot be a row)."""
    env = load_environment(config)
    taskset = env.taskset.take(limit) if limit is not None else env.taskset
    if not taskset.bounded:
        raise VerifiersError(f"{config.env}: the taskset is infinite; bound it with dataset.limit")
    rows = []
    for task in taskset:
        data = task.data
        if data.prompt is None:
            raise VerifiersError(f"{config.env}: task {data.idx} has no prompt (a user-opened episode); refused")
        prompt = ([{"role": "user", "content": data.prompt}] if isinstance(data.prompt, str)
                  else [m.model_dump(mode="json", exclude_none=True) for m in data.prompt])
        system = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        rows.append({"id": data.id or data.name or f"task-{data.idx}", "messages": system + prompt,
                     TASK_FIELD: data.model_dump(mode="json")})
    if not rows:
        raise VerifiersError(f"{config.env}: the taskset has no tasks")
    return rows


def task_of(env: Env, row: dict[str, Any]) -> Task:
    """The task a row holds, rebuilt from its wire data."""
    task_type = type(env.taskset).task_type()
    return task_type(task_type.data_type().model_validate(row[TASK_FIELD]), env.taskset.config.task)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]
