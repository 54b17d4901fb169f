"""Our rollouts and weight pushes behind TRL AsyncGRPOTrainer's two seams (``trl.experimental.async_grpo``).

```python
with AsyncAgentLoopRollout(spec, rows, max_staleness=args.max_staleness) as rollout:
    trainer = AsyncGRPOTrainer(model_dir, args=args, train_dataset=prompt_dataset(rows),
                               rollout_worker=AgentLoopRolloutWorker(rollout, args.num_generations, groups_per_step),
                               weight_transfer=AgentLoopWeightTransfer(rollout))
    trainer.train()
```

- ``AgentLoopRolloutWorker`` (``RolloutWorkerProtocol``): the rollout's ``GroupStream`` runs our loops (or an
  agent's gateway sessions) without stopping, admitted by the trainer's version (``update_model_version``), and a
  pump turns each finished group, oldest first, into ``RolloutSample``s (``rollout_samples.py``) on
  ``rollout_buffer``; failures are counted on ``metrics_queue``, never queued as samples, and groups are admitted
  in place of failed trajectories and of samples the trainer drops as too stale (it counts samples, not groups),
  until a window of groups in a row gave none (the engines are gone). ``check_health`` raises
  the stream's error, when no group finished for ``stale_after_s`` while groups were running, or ``StreamStarved``
  at once when the trainer waits on an empty buffer that no group can fill before it steps (their trajectories
  failed: every one of them, or enough to leave the step short).
- ``AgentLoopWeightTransfer`` (``WeightTransferProtocol``): ``send_weights`` pushes the trainer's tensors through
  the manager (collective, path or stream, as ``auto`` chooses), versioned so that engine version minus the
  engines' version at start is the trainer's ``model_version``; ``pause``/``resume`` do nothing by default (the
  engines stage the weights and swap them between two decode steps, requests in flight go on), or pause the
  engines with KEEP when ``keep=True``.

The trainer's loss takes ``old_log_probs`` as the policy that sampled: its PPO ratio is clipped against the
behaviour policy itself (AReaL's coupled objective), which is its staleness correction; the rollout correction's
weights (``correction.py``, GRPOTrainer's path) would need its loss replaced. With ``constrain_tool_calls`` the
engine's logprobs are under the call grammar's mask (see ``logprob_check.py``), so its ratio then mixes in the
mass the grammar removed; leave calls unconstrained for this trainer.

AsyncGRPOTrainer itself (trl 1.16) needs CUDA in two places; ``async_trainer.py`` (``AgentLoopAsyncGRPOTrainer``,
``agentloop train``'s ``trainer: trl_async``) builds both seams and falls back where CUDA or FlashAttention 3 is absent.
"""

from __future__ import annotations

import collections
import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from agentloop_grpc.agent import Trajectory
from agentloop_grpc.common.types import PauseMode

from ..named_tensors import named_tensor
from .rollout import AgentLoopRollout
from .rollout_samples import rollout_samples

if TYPE_CHECKING:
    import multiprocessing.queues

    from ..group_stream import GroupStream


#: The longest the trainer waits on an empty rollout buffer before it checks the worker's health again.
HEALTH_POLL_S = 0.5


class AgentLoopRolloutWorker:
    """TRL's ``RolloutWorkerProtocol`` over an ``AgentLoopRollout`` (see the module docstring).
    ``groups_per_step``: groups one optimizer step trains (its samples / ``num_generations``)."""

    def __init__(self, rollout: AgentLoopRollout, num_generations: int, groups_per_step: int) -> None:
        if num_generations < 1 or groups_per_step < 1:
            raise ValueError("num_generations and groups_per_step must be >= 1")
        self.rollout = rollout
        self.num_generations, self.groups_per_step = num_generations, groups_per_step
        self.model_version = 0  # the trainer's, as it last said
        # typed as TRL's RolloutWorkerProtocol has them
        self.rollout_buffer: queue.Queue | multiprocessing.queues.Queue = _TakenQueue(self._kept)
        self.metrics_queue: queue.Queue | multiprocessing.queues.Queue = queue.Queue()
        self._pump: concurrent.futures.Future | None = None
        self._last_group_at = time.monotonic()
        # each queued group's trajectories (failed ones too) by group_id, until the trainer says it trained them
        self._groups: dict[int, tuple[Trajectory, ...]] = {}
        self._groups_lock = threading.Lock()  # the pump fills it on the rollout's loop, the trainer takes
        self.samples_given = 0  # queued on rollout_buffer so far
        self._owed = 0  # samples that will not come (failed, dropped) less those admitted in their place
        self._empty_in_a_row = 0  # groups, in admission order, that gave no sample since the last that gave one

    def start(self) -> None:
        stream = self.rollout.open_stream(self.num_generations, self.groups_per_step)
        self._last_group_at = time.monotonic()
        self._pump = self.rollout.submit(self._fill(stream))

    async def _fill(self, stream) -> None:
        while True:
            [group] = await stream.take(1)
            samples, metrics = rollout_samples(group.samples, group.trajectories, group.index,
                                               self.rollout.clock)
            with self._groups_lock:
                self._groups[group.index] = tuple(group.trajectories)
            for sample in samples:
                self.rollout_buffer.put_nowait(sample)  # unbounded: admission bounds what can be queued
            self.samples_given += len(samples)
            self._empty_in_a_row = 0 if samples else self._empty_in_a_row + 1
            self._owe(len(group.trajectories) - len(samples))
            self.metrics_queue.put_nowait({**metrics, "agentloop/rollout_queue_groups": float(stream.counters.waiting)})
            self._last_group_at = time.monotonic()

    def _owe(self, samples: int) -> None:
        """``samples`` the trainer will not get: admit groups in their place (rounded up to whole groups), unless a
        window's worth of groups in a row gave none (the stream then runs dry and ``check_health`` says why). On
        the rollout's loop."""
        self._owed += samples
        stream = self.rollout.stream
        window = self.groups_per_step * (self.rollout.clock.max_staleness + 1)
        if stream is not None and self._owed > 0 and self._empty_in_a_row < window:
            groups = -(-self._owed // self.num_generations)
            stream.replace(groups)
            self._owed -= groups * self.num_generations

    async def _owe_on_loop(self, samples: int) -> None:
        self._owe(samples)

    def _kept(self, sample: Any) -> bool:
        """Whether the trainer keeps a sample it takes now: its own staleness rule, at its version (one it drops
        is owed)."""
        kept = self.model_version - sample.model_version <= self.rollout.clock.max_staleness
        if not kept:
            self.rollout.submit(self._owe_on_loop(1))
        return kept

    def trained_groups(self, samples: int) -> list[int]:
        """The groups of the next ``samples`` samples the trainer took and kept, in its order: a step's, read
        after the step (its dataloader takes a micro-batch ahead, so what was taken is not what was trained)."""
        assert isinstance(self.rollout_buffer, _TakenQueue)  # ours
        taken = self.rollout_buffer.taken
        return list(dict.fromkeys(taken.popleft() for _ in range(min(samples, len(taken)))))

    def take_groups(self, group_ids: Iterable[int]) -> tuple[Trajectory, ...]:
        """The trajectories of the groups ``group_ids`` (those the trainer trained), which are forgotten with every
        older group (taken oldest first: an older one left was dropped as too stale)."""
        ids = sorted(group_ids)
        with self._groups_lock:
            taken = tuple(t for i in ids for t in self._groups.pop(i, ()))
            for i in [i for i in self._groups if ids and i < ids[0]]:
                del self._groups[i]
        return taken

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version
        self.rollout.advance(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._pump is None:
            raise RuntimeError("the rollout worker was not started")
        if self._pump.done():
            error = None if self._pump.cancelled() else self._pump.exception()
            raise RuntimeError("the rollout worker stopped producing") from error
        stream = self.rollout.stream
        idle = time.monotonic() - self._last_group_at
        if stream is not None and stream.counters.in_flight and idle > stale_after_s:
            raise RuntimeError(f"no group finished for {idle:.1f} s (> {stale_after_s:g} s) while "
                               f"{stream.counters.in_flight} ran")
        # the trainer asks only after waiting on an empty buffer; the stream's state is read on its own loop, where
        # the pump moves a taken group's samples to the buffer without yielding
        if stream is not None and self.rollout.submit(self._starved(stream)).result():
            with self._groups_lock:
                untrained = tuple(t for group in self._groups.values() for t in group)
            raise StreamStarved(untrained, self.samples_given)

    async def _starved(self, stream: GroupStream) -> bool:
        return stream.exhausted() and self.rollout_buffer.empty()

    def stop(self) -> None:
        """Stop the pump and the stream; the rollout (its manager and engines' channels) stays its owner's."""
        if self._pump is not None:
            self._pump.cancel()
            self._pump = None
        self.rollout.close_stream()


class StreamStarved(RuntimeError):
    """The trainer waits for samples that no group can give before it steps: failed trajectories left it short and
    no more groups are admitted in their place. ``trajectories``: those of the groups it has not trained (failed
    ones too); ``samples_given``: the samples the stream gave in all (0: none, so no step trained)."""

    def __init__(self, trajectories: tuple[Trajectory, ...], samples_given: int) -> None:
        self.trajectories, self.samples_given = trajectories, samples_given
        failed = sum(t.failed for t in trajectories)
        super().__init__(
            f"every one of the {len(trajectories)} trajectories rolled out failed, so no step had a sample to train"
            if self.every_trajectory_failed else
            f"{failed} of the {len(trajectories)} trajectories not yet trained failed, the latest groups' every one, "
            "so no more were admitted in their place and the trainer is short of samples" if failed else
            "the trainer asks for samples of its next step before it steps, and max_staleness admits no group for "
            "them until then (AsyncGRPOTrainer reads a micro-batch ahead: max_staleness 0 cannot feed it)")

    @property
    def every_trajectory_failed(self) -> bool:
        return not self.samples_given and all(t.failed for t in self.trajectories)


class _TakenQueue(queue.Queue):
    """The rollout buffer, remembering the group of each sample the trainer takes and keeps (``kept``)."""

    def __init__(self, kept: Callable[[Any], bool]) -> None:
        super().__init__()
        self.kept = kept
        self.taken: collections.deque[int] = collections.deque()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        # the trainer checks the worker's health each time a wait times out: each half second, not its 5 s, so that
        # a starved stream stops it at once
        sample = super().get(block, timeout if timeout is None else min(timeout, HEALTH_POLL_S))
        if self.kept(sample):
            self.taken.append(sample.group_id)
        return sample


class AgentLoopWeightTransfer:
    """TRL's ``WeightTransferProtocol`` through the rollout's manager (see the module docstring)."""

    def __init__(self, rollout: AgentLoopRollout, keep: bool = False) -> None:
        self.rollout = rollout
        self.keep = keep
        self.sent = 0  # the trainer's model_version after the last send
        self.last_send_s = 0.0

    def init_weight_transfer(self) -> None:
        self.rollout.start()

    def _run(self, coroutine) -> Any:
        return self.rollout.submit(coroutine).result()

    def pause(self) -> None:
        if self.keep:
            self._run(_pause_keep(self.rollout))

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        started = time.monotonic()
        tensors = [named_tensor(name, tensor) for name, tensor in iterator]
        # the trainer's model_version counts its updates from 0: the clock's base is where they start
        self._run(self.rollout.manager.update_weights(tensors, self.rollout.clock.base + self.sent + 1,
                                                      leave_out_unreachable=True))
        self.sent += 1
        self.last_send_s = time.monotonic() - started

    def resume(self) -> None:
        if self.keep:
            self._run(_resume(self.rollout))

    def destroy(self) -> None:
        """The rollout (and its manager) is the worker's to close."""


async def _pause_keep(rollout: AgentLoopRollout) -> None:
    control = rollout.manager.control
    assert control is not None  # a started manager has its Fleet
    (await control.pause(PauseMode.KEEP)).raise_for_errors()


async def _resume(rollout: AgentLoopRollout) -> None:
    control = rollout.manager.control
    assert control is not None
    (await control.resume()).raise_for_errors()

