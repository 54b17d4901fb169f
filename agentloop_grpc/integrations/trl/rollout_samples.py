"""A rolled-out group -> TRL AsyncGRPOTrainer's ``RolloutSample``s, token-exactly.

- ``input_ids``: the prompt as the loop encoded it, then every response token as recorded (model turns, tool
  turns, template separators): never re-tokenized;
- ``completion_mask``: 0 on the prompt, then our response mask (1 on model tokens only);
- ``old_log_probs``: the engine's logprob of each model token (0.0 elsewhere): what the tokens were sampled from;
- ``advantage``: the trajectory's reward minus its group's mean, over the group's std (TRL's worker's formula),
  over the trajectories that did not fail;
- ``model_version``: the oldest weight version among its model tokens, counted as the trainer counts (engine
  version minus the engines' version when the run started), which is what the trainer's staleness check reads;
- ``group_id``: the group's admission number; ``metrics``: reward and the group's reward std, as TRL's worker.

A failed trajectory (a dead engine or tool server, a bad row, a model error that ended it) is no sample: it is
counted in the metrics, and left out of its group's mean and std.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from agentloop_grpc.agent import Sample, Trajectory
from agentloop_grpc.agent.metrics import infrastructure_causes

from ..group_stream import oldest_version
from ..version_clock import VersionClock


def rollout_samples(samples: Sequence[Sample], trajectories: Sequence[Trajectory], group_id: int,
                    clock: VersionClock) -> tuple[list[Any], dict[str, float]]:
    """(``RolloutSample``s, metrics for the trainer's metrics queue) of one group; a sample's ``model_version`` is
    its oldest token's version as the trainer counts it (updates of this run, ``clock``)."""
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    versions = [oldest_version((t,)) for t in trajectories]  # None: failed, or no model token
    kept = [(s, t, v) for s, t, v in zip(samples, trajectories, versions, strict=True) if v is not None]
    rewards = [t.reward for _, t, _ in kept]
    mean = statistics.fmean(rewards) if rewards else 0.0
    std = statistics.pstdev(rewards) if rewards else 0.0
    now = time.time()
    out = []
    for sample, t, version in kept:
        prompt = len(t.prompt_ids)
        out.append(RolloutSample(
            prompt=list(sample.messages),
            completion=[],
            input_ids=np.asarray(list(t.prompt_ids) + list(t.response_ids), dtype=np.int64),
            completion_mask=np.asarray([0] * prompt + list(t.response_mask), dtype=np.int64),
            old_log_probs=np.asarray([0.0] * prompt + [lp if m else 0.0 for lp, m in
                                                       zip(t.response_logprobs, t.response_mask, strict=True)],
                                     dtype=np.float32),
            advantage=(t.reward - mean) / (std + 1e-8),
            model_version=clock.steps_since_start(version),
            group_id=group_id,
            metrics={"reward": float(t.reward), "reward_std": std},
            enqueued_at=now,
        ))
    failed = [t for t in trajectories if t.failed]
    metrics = {
        "agentloop/failed_trajectories_total": float(len(failed)),
        "agentloop/infrastructure_failures_total": float(sum(t.infrastructure_failure for t in failed)),
        **{f"agentloop/infrastructure_failures/{cause}_total": float(n)
           for cause, n in infrastructure_causes(failed).items()},
        "agentloop/groups_total": 1.0,
    }
    return out, metrics
