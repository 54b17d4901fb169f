"""RayAgentLoopWorker: an AgentLoopWorker inside a Ray actor (asyncio inside), built from a WorkerSpec.

The class is plain; the manager wraps it with ``ray.remote`` when ``--ray`` is asked for, so importing this module
never imports Ray. The same code runs on a local Ray or on a cluster (the actor builds its own channels, tokenizer
and tool client on the node it lands on). Parts named by import path in the spec (reward, interactions, custom
loops) are imported there too, so their modules must be importable on every node: a local Ray starts its workers
in the driver's working directory, a cluster wants them installed or in the job's runtime_env.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from .sample import Sample
from .spec import WorkerSpec, build_worker
from .trajectory import Trajectory
from .worker import AgentLoopWorker


class RayAgentLoopWorker:
    def __init__(self, spec: WorkerSpec, index: int) -> None:
        self._spec = spec
        self._index = index
        self._stack = AsyncExitStack()
        self._worker: AgentLoopWorker | None = None

    async def start(self) -> None:
        self._worker, _ = await build_worker(self._spec, self._stack, self._index)

    async def run(self, samples: list[Sample]) -> list[Trajectory]:
        if self._worker is None:
            raise RuntimeError("start() the worker first")
        return await self._worker.run(samples)

    async def close(self) -> None:
        await self._stack.aclose()
