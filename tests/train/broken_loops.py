"""Loops of a user's own that go wrong in each way a config check must catch (named by import path in a test's
YAML, as a user's module would be): one fails every trajectory, one's constructor refuses to build."""

from __future__ import annotations

from agentloop_grpc.agent import LoopContext, Sample, Trajectory

PATH = "tests.train.broken_loops"


class FailEveryRun:
    """Builds; every run raises, so every trajectory fails (a training run of it learns nothing)."""

    def __init__(self, context: LoopContext) -> None:
        self.context = context

    async def run(self, sample: Sample) -> Trajectory:
        raise RuntimeError("this loop fails every trajectory")


class RefuseToBuild:
    """Its constructor raises what a user's own validation might (not a TypeError or ValueError)."""

    def __init__(self, context: LoopContext, **kwargs: object) -> None:
        raise RuntimeError("no GPU for this loop")
