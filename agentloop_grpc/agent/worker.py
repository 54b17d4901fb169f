"""AgentLoopWorker: runs many loops concurrently on one event loop, bounded, with failures isolated.

One coroutine per sample. A sample whose loop raises (a bug, a broken tool, a bad row) becomes a flagged
trajectory (termination ERROR) and the batch goes on: one broken trajectory never fails the batch.

Loops start one at a time, each followed by one pass of the event loop, so a loop's first request is on its way
to the engine while the next loops still render and encode their prompts. Started all at once (one gather), every
loop's first step ran before the first request left, and the engines idled while the whole batch prepared
(figures in NOTES.md beside this file).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from .errors import INFRASTRUCTURE_ERRORS, REQUEST_ERRORS
from .images import unread
from .loops.base import LoopRegistry
from .sample import Sample
from .trajectory import Termination, Trajectory

log = logging.getLogger(__name__)


def failed_trajectory(sample: Sample, error: str, infrastructure: bool, cause: str | None = None) -> Trajectory:
    """The record of a sample whose loop could not even produce a partial trajectory (``cause``: what failed, for
    an infrastructure failure)."""
    return Trajectory(
        sample_id=sample.sample_id,
        loop=sample.loop,
        group_id=sample.group_id,
        prompt_ids=(),
        response_ids=(),
        response_mask=(),
        response_logprobs=(),
        weight_versions=(),
        reward=0.0,
        termination=Termination.ERROR,
        error=error,
        infrastructure_failure=infrastructure,
        infrastructure_cause=(cause or "unspecified") if infrastructure else None,
        messages=tuple(unread(sample.messages)),  # no picture bytes in a record meant to be read
    )


class AgentLoopWorker:
    def __init__(self, registry: LoopRegistry, max_concurrency: int = 256) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        self.registry = registry
        self.max_concurrency = max_concurrency

    async def run_one(self, sample: Sample) -> Trajectory:
        try:
            return await self.registry.get(sample.loop).run(sample)
        except INFRASTRUCTURE_ERRORS as error:
            return failed_trajectory(sample, str(error), infrastructure=True, cause=error.cause)
        except (*REQUEST_ERRORS, KeyError, ValueError) as error:
            return failed_trajectory(sample, f"{type(error).__name__}: {error}", infrastructure=False)
        except Exception as error:  # isolation: a loop bug must not fail the batch
            log.exception("sample %s: the loop failed", sample.sample_id)
            return failed_trajectory(sample, f"internal error: {type(error).__name__}: {error}", infrastructure=False)

    async def run(
        self, samples: Sequence[Sample], on_done: Callable[[Trajectory], None] | None = None
    ) -> list[Trajectory]:
        """Run every sample; trajectories come back in the samples' order. ``on_done`` sees each as it ends."""
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(sample: Sample) -> Trajectory:
            async with gate:
                trajectory = await self.run_one(sample)
            if on_done is not None:
                on_done(trajectory)
            return trajectory

        tasks: list[asyncio.Task[Trajectory]] = []
        try:
            for sample in samples:
                tasks.append(asyncio.ensure_future(one(sample)))
                await asyncio.sleep(0)  # the loop just started reaches its engine before the next one starts
            return list(await asyncio.gather(*tasks))
        except BaseException:  # cancelled (or failed) while starting: stop every loop already started
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
