"""TrainRecord: what a training run leaves for its summary, its report and its exit code (``run.run_training`` fills
it; ``report.write_report`` and the ``agentloop train`` command read it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agentloop_grpc.agent import Trajectory


@dataclass
class TrainRecord:
    output_dir: Path
    steps: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    #: The failed trajectories' most common error causes over the rollouts kept in the rollout's history.
    error_causes: list[tuple[str, int]] = field(default_factory=list)
    #: ``trainer: trl_async`` stopped before its first step, every trajectory failed: those trajectories.
    untrained: tuple[Trajectory, ...] = ()

    @property
    def failed_and_all(self) -> tuple[int, int]:
        """(failed, all) trajectories over every step, and those no step trained."""
        return (int(sum(s.get("failures", 0) for s in self.steps)) + sum(t.failed for t in self.untrained),
                int(sum(s.get("trajectories", 0) for s in self.steps)) + len(self.untrained))
