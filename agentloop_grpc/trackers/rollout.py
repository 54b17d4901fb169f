"""What a rollout logs to its trackers: every ``log_every`` finished trajectories, the metrics of those
trajectories (a window, so a long run costs the same per point and a trend shows); the step is the count of
finished trajectories. At the last step: the closing summary (the whole run) and the samples table."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from agentloop_grpc.agent import Trajectory
from agentloop_grpc.agent.metrics import RolloutMetrics

from .base import SampleRow
from .open_trackers import Trackers


def rollout_metrics(metrics: RolloutMetrics) -> dict[str, float]:
    """One window's metrics, named ``rollout/...``; terminations by kind as ``rollout/terminations/KIND``."""
    return {
        "rollout/failures": metrics.failures,
        "rollout/mean_reward": metrics.mean_reward,
        "rollout/correct_rate": metrics.correct_rate,
        "rollout/valid_tool_call_rate": metrics.valid_tool_call_rate,
        "rollout/tool_call_attempts": metrics.tool_call_attempts,
        "rollout/mean_assistant_turns": metrics.mean_assistant_turns,
        "rollout/model_tokens": metrics.model_tokens,
        "rollout/model_tokens_per_s": metrics.model_tokens_per_s,
        **{f"rollout/terminations/{kind}": count for kind, count in metrics.terminations.items()},
    }


def summary_metrics(summary: Mapping[str, object]) -> dict[str, float]:
    """The numbers of summary.json, named ``summary/...`` (nested ones joined with '/'; text left out)."""
    found: dict[str, float] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, bool):
            found[prefix] = float(value)
        elif isinstance(value, int | float):
            found[prefix] = value
        elif isinstance(value, Mapping):
            for key, inner in value.items():
                walk(f"{prefix}/{key}", inner)

    for key, value in summary.items():
        walk(f"summary/{key}", value)
    return found


def sample_rows(trajectories: Sequence[Trajectory], decode: Callable[[Sequence[int]], str],
                count: int) -> list[SampleRow]:
    """The first ``count`` trajectories in the samples' order (whole GRPO groups side by side), decoded."""
    return [SampleRow(sample_id=t.sample_id, prompt=decode(t.prompt_ids), response=decode(t.response_ids),
                      reward=t.reward, termination=t.termination.value, error=t.error or "")
            for t in trajectories[:count]]


class RolloutTracking:
    """Feeds one rollout's trackers as trajectories finish (it keeps them in the order they finished)."""

    def __init__(self, trackers: Trackers, log_every: int, samples: int) -> None:
        self.trackers, self.log_every, self.samples = trackers, log_every, samples
        self._finished: list[Trajectory] = []
        self._logged = 0
        self._logged_s = 0.0

    def advance(self, trajectory: Trajectory, wall_s: float) -> None:
        """Called for each finished trajectory (``wall_s``: since the run started); logs every ``log_every``."""
        self._finished.append(trajectory)
        if len(self._finished) - self._logged >= self.log_every:
            self._log(wall_s)

    def finish(self, trajectories: Sequence[Trajectory], wall_s: float, summary: Mapping[str, object],
               decode: Callable[[Sequence[int]], str]) -> None:
        """The last step: the last window (when not just logged), the summary, the samples table from
        ``trajectories`` (the run's, in the samples' order)."""
        if len(self._finished) != self._logged:
            self._log(wall_s)
        step = len(self._finished)
        self.trackers.log_metrics(summary_metrics(summary), step)
        self.trackers.log_samples(sample_rows(trajectories, decode, self.samples), step)

    def _log(self, wall_s: float) -> None:
        window = RolloutMetrics.of(self._finished[self._logged:], wall_s - self._logged_s)
        self._logged, self._logged_s = len(self._finished), wall_s
        self.trackers.log_metrics(rollout_metrics(window), self._logged)
