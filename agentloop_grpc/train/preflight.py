"""What `agentloop train` checks before it imports the trainer (TRL, transformers: seconds on a small machine) or
starts a server: the dataset's rows and every loop or agent they name, as a rollout checks them."""

from __future__ import annotations

from agentloop_grpc.rollout.dataset import read_rows, to_samples
from agentloop_grpc.rollout.run import check_loops, gateway_player

from .config import TrainConfig


def checked_rows(config: TrainConfig) -> list[dict]:
    """The dataset's rows; DatasetError or LoopConfigError (one line) when a row or a loop could not run."""
    rows = read_rows(config.dataset)
    check_loops(config, to_samples(rows, config.dataset, 1))
    if config.agent is not None:
        gateway_player(config.agent, config.dataset.reward)
    return rows
