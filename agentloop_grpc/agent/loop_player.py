"""LoopPlayer: our agent loops as a ``Player``: the samples split across the manager's workers (in this process,
or Ray actors), contiguous chunks so that a prompt's GRPO group stays mostly on one worker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .sample import Sample
from .trajectory import Trajectory

OnDone = Callable[[Trajectory], None] | None
#: One worker's run: its chunk of samples -> their trajectories in order, each given to ``on_done`` as it ends.
WorkerRun = Callable[[list[Sample], OnDone], Awaitable[list[Trajectory]]]


def split(samples: Sequence[Sample], parts: int) -> list[list[Sample]]:
    """Contiguous, near-equal chunks (a prompt's GRPO group stays mostly on one worker)."""
    size, extra = divmod(len(samples), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(list(samples[start:end]))
        start = end
    return chunks


class LoopPlayer:
    """Plays samples on ``workers`` (one run per worker); a sample's loop reads everything from the sample, so
    dataset rows are not used."""

    def __init__(self, workers: Sequence[WorkerRun]) -> None:
        if not workers:
            raise ValueError("a LoopPlayer needs at least one worker")
        self.workers = tuple(workers)

    async def play(self, samples: Sequence[Sample], rows: Sequence[Mapping[str, Any]] | None,
                   on_done: OnDone) -> list[Trajectory]:
        chunks = split(samples, len(self.workers))
        results = await asyncio.gather(*(run(c, on_done) for run, c in zip(self.workers, chunks, strict=True)))
        return [t for chunk in results for t in chunk]
