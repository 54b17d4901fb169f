"""AsyncAgentLoopRollout: GRPOTrainer's ``rollout_func`` fed by rollouts that never stop (fully-async mode).

``AgentLoopRollout`` rolls out a step's prompts when the trainer asks and the engines idle while it trains. Here a
``GroupStream`` keeps the engines busy: groups are admitted while the trainer is at most ``max_staleness``
versions ahead of them (the capacity rule, ``group_stream.py``), and each ``rollout_func`` call takes the oldest
finished groups, as many as the trainer's prompts make. The dataset order is the stream's (the rows shuffled with
``seed``, every row once per epoch): TRL's ``prompts`` only say how many groups a step trains, since a group must
start before the step that trains it asks. Everything else is ``AgentLoopRollout``'s: trajectories as TRL's fields,
rewards, failed trajectories masked out of the loss, weights pushed after every step (the engines swap them in
between two decode steps, groups in flight go on; tokens record the version that made them), an agent of your own.

TRL's loss is unchanged: it takes each sample as produced by the weights it trains (its old logprobs are its own,
as verl's one-step off-policy does). ``max_staleness`` bounds how far that is from true: each step's metrics carry
the staleness of every trained trajectory (trained version minus its oldest token's), the queue, and the seconds
trainer and engines waited for each other.
"""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentloop_grpc.agent import Sample, Trajectory
from agentloop_grpc.agent.metrics import RolloutMetrics
from agentloop_grpc.agent.row_sample import row_sample

from ..group_stream import GroupStream, oldest_version
from .fields import trl_fields
from .rollout import AgentLoopRollout, StepRecord, step_metrics


class AsyncAgentLoopRollout(AgentLoopRollout):
    """See the module docstring; the arguments are ``AgentLoopRollout``'s, and ``max_staleness`` (versions a trained
    group may lag the trainer; 0: a step's groups start only once the previous step's weights are on the engines)
    and ``seed`` (the dataset order)."""

    def __init__(self, *args: Any, max_staleness: int = 1, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.max_staleness = max_staleness
        self.seed = seed
        self._order = list(self._rows.values())
        self._epoch: tuple[int, list[int]] = (-1, [])  # groups are admitted in order: one epoch's order at a time
        self._stream: GroupStream | None = None
        self._group_size = 0
        self._last = {"trainer_wait_s": 0.0, "engine_idle_s": 0.0, "dropped_stale": 0, "forked_chains": 0}

    def close(self) -> None:
        self.close_stream()
        super().close()

    def close_stream(self) -> None:
        """Stop admitting and cancel the groups still rolling out (the manager stays up)."""
        if self._stream is not None and self._loop is not None:
            self._loop.run(self._stream.close())
        self._stream = None

    def _row(self, index: int) -> Mapping[str, Any]:
        """The row of the ``index``-th group: every row once per epoch, each epoch in its own seeded order."""
        epoch, position = divmod(index, len(self._order))
        if self._epoch[0] != epoch:
            order = list(range(len(self._order)))
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._epoch = (epoch, order)
        return self._order[self._epoch[1][position]]

    def _group(self, index: int) -> list[Sample]:
        row = self._row(index)
        return [row_sample(row, f"a{index}/{k}", f"a{index}", self.default_loop, self.ground_truth_kwargs)
                for k in range(self._group_size)]

    async def _run_group(self, samples: Sequence[Sample]):
        return await self.manager.generate(samples, player=self._players, rows=self.rows_of(samples))

    async def _start_stream(self, groups_per_step: int, version: int) -> GroupStream:
        stream = GroupStream(self._group, self._run_group, groups_per_step, self.max_staleness, version)
        await stream.start()
        return stream

    def open_stream(self, group_size: int, groups_per_step: int) -> GroupStream:
        """Start the stream of groups of ``group_size`` (admitting ``groups_per_step`` per trainer version, from
        the engines' version now); a consumer drives it on this rollout's loop (``set_version``, ``take``)."""
        if self._stream is not None:
            raise RuntimeError("this rollout's stream is already open")
        if group_size < 1:
            raise ValueError("group_size must be >= 1")
        if not self._order:
            raise ValueError("no dataset rows to roll out")
        self.start()
        assert self._loop is not None  # started
        self._group_size = group_size
        self._stream = self._loop.run(self._start_stream(groups_per_step, self.base_version))
        return self._stream

    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        if self._loop is None:
            self.start()
        loop = self._loop
        assert loop is not None  # started above
        if not trainer.model.training:  # evaluation: the prompts asked, on the weights of now
            return super().__call__(prompts, trainer)
        group_size = trainer.num_generations
        if group_size < 1 or len(prompts) % group_size:
            raise ValueError(f"{len(prompts)} prompts do not split into groups of num_generations={group_size}")
        step = int(trainer.state.global_step)
        version = self.base_version + step
        stream = self._stream or self.open_stream(group_size, len(prompts) // group_size)
        loop.run(_set_version(stream, version))
        started = time.monotonic()
        groups = loop.run(stream.take(len(prompts) // group_size))
        waited = time.monotonic() - started
        trajectories = tuple(t for g in groups for t in g.trajectories)
        record = StepRecord(step, trajectories, waited)
        record.metrics = step_metrics(trajectories, RolloutMetrics.of(trajectories, waited), version)
        record.metrics.update(self._stream_metrics(stream, trajectories, version))
        if self._players is not None:
            record.metrics["forked_chains"] = float(self._players.forked_chains - self._last["forked_chains"])
            self._last["forked_chains"] = self._players.forked_chains
        if self.check_logprobs:  # on the tokens the trainer's weights made (older ones differ by design)
            offered = {t.sample_id: s.tools for g in groups for s, t in zip(g.samples, g.trajectories, strict=True)}
            record.metrics.update(self._check_logprobs(trainer, trajectories, offered, version))
        self.history.append(record)
        return trl_fields(trajectories, self.placeholder_id)

    def _stream_metrics(self, stream: GroupStream, trajectories: Sequence[Trajectory],
                        version: int) -> dict[str, float]:
        """The step's staleness histogram (``staleness_K``: trajectories trained K versions after their oldest
        token), the queue, and the seconds trainer and engines waited since the last step."""
        counters = stream.counters
        staleness = [version - v for t in trajectories if (v := oldest_version((t,))) is not None]
        metrics: dict[str, float] = {f"staleness_{k}": float(staleness.count(k))
                                     for k in range(self.max_staleness + 1)}
        engine_idle = stream.engine_idle_s()
        metrics.update({
            "staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
            "staleness_max": float(max(staleness, default=0)),
            "queue_groups": float(counters.waiting),
            "in_flight_groups": float(counters.in_flight),
            "dropped_stale": float(counters.dropped_stale - self._last["dropped_stale"]),
            "trainer_idle_s": counters.trainer_wait_s - self._last["trainer_wait_s"],
            "engine_idle_s": engine_idle - self._last["engine_idle_s"],
        })
        self._last.update(trainer_wait_s=counters.trainer_wait_s, engine_idle_s=engine_idle,
                          dropped_stale=counters.dropped_stale)
        return metrics

    @property
    def stream(self) -> GroupStream | None:
        """The open stream of groups (None before ``open_stream`` or the first training call)."""
        return self._stream

    def submit(self, coroutine) -> concurrent.futures.Future:
        """Start ``coroutine`` on this rollout's loop (where the stream lives) without waiting."""
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("the rollout is not started")
        return self._loop.submit(coroutine)

    def advance(self, trained_versions: int) -> None:
        """The engines now hold the trainer's weights after ``trained_versions`` updates: more groups may start."""
        if self._stream is not None and self._loop is not None:
            self._loop.run(_set_version(self._stream, self.base_version + trained_versions))

    def push_weights(self, model, step: int) -> float:
        seconds = super().push_weights(model, step)
        self.advance(step)
        return seconds


async def _set_version(stream: GroupStream, version: int) -> None:
    if version > stream.version:
        stream.set_version(version)
