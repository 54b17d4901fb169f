"""AsyncAgentLoopRollout: GRPOTrainer's ``rollout_func`` fed by rollouts that never stop (fully-async mode).

``AgentLoopRollout`` rolls out a step's prompts when the trainer asks and the engines idle while it trains. Here a
``GroupStream`` keeps the engines busy: groups are admitted while the trainer is at most ``max_staleness``
versions ahead of them (the capacity rule, ``group_stream.py``), and each ``rollout_func`` call takes the oldest
finished groups, as many as the trainer's prompts make (``streamed_groups.py``: the dataset order is the stream's).
It is the same ``AgentLoopRollout`` over that streaming source: trajectories as TRL's fields, rewards, failed
trajectories masked out of the loss, weights pushed after every step (the engines swap them in between two decode
steps, groups in flight go on; tokens record the version that made them), an agent of your own.

TRL's loss is unchanged: it takes each sample as produced by the weights it trains (its old logprobs are its own,
as verl's one-step off-policy does). ``max_staleness`` bounds how far that is from true: each step's metrics carry
the staleness of every trained trajectory (trained version minus its oldest token's), the queue, and the seconds
trainer and engines waited for each other.
"""

from __future__ import annotations

from typing import Any

from .rollout import AgentLoopRollout


def AsyncAgentLoopRollout(*args: Any, max_staleness: int = 1, seed: int = 0,
                          **kwargs: Any) -> AgentLoopRollout:
    """An ``AgentLoopRollout`` over the streaming source (see the module docstring); the arguments are its own,
    ``max_staleness`` (versions a trained group may lag the trainer; 0: a step's groups start only once the
    previous step's weights are on the engines) and ``seed`` (the dataset order)."""
    return AgentLoopRollout(*args, max_staleness=max_staleness, seed=seed, **kwargs)
