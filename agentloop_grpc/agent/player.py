"""Player: who plays a batch of samples, whatever plays them. ``AgentLoopManager.generate`` runs one with the same
wake, sleep and checks around: its own workers' loops (``LoopPlayer``) by default, or the one it is given (an
agent of your own through the session gateway: ``integrations/gateway_player.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .sample import Sample
from .trajectory import Trajectory


class Player(Protocol):
    async def play(self, samples: Sequence[Sample], rows: Sequence[Mapping[str, Any]] | None,
                   on_done: Callable[[Trajectory], None] | None) -> list[Trajectory]:
        """Every sample's trajectories in the samples' order (a player that forks chains says where they go);
        ``rows``: each sample's dataset row, aligned with ``samples`` (None: the samples say everything, as our
        loops need); ``on_done`` gets each trajectory as it ends."""
        ...
