"""The interface every tracker implements, and the row of the samples table they all log.

A tracker gets flat metrics with a step and, once, a table of sampled trajectories; each module turns these into
its tool's own calls (TensorBoard scalars and a text summary, W&B history and a ``wandb.Table``, MLflow metrics and
``log_table``). Trackers are opened by ``open_trackers`` and closed by the run that opened them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

#: The samples table's columns, in the order of ``SampleRow.values``.
SAMPLE_COLUMNS = ("sample_id", "prompt", "response", "reward", "termination", "error")


@dataclass(frozen=True, slots=True)
class SampleRow:
    """One trajectory as the samples table shows it."""

    sample_id: str
    prompt: str
    response: str
    reward: float
    termination: str
    error: str

    def values(self) -> tuple[str, str, str, float, str, str]:
        return (self.sample_id, self.prompt, self.response, self.reward, self.termination, self.error)


class Tracker(Protocol):
    """What a run logs to; metric names are slash-separated (``rollout/mean_reward``)."""

    #: Where to look at the run, one line for the user (a command or an address).
    where: str

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_samples(self, rows: Sequence[SampleRow], step: int) -> None: ...

    def close(self) -> None: ...
