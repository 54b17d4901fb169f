"""AgentLoopManager: what the trainer calls. Splits a batch across workers and returns trajectories and metrics.

Workers run in this process by default, or as Ray actors (``use_ray``: a local Ray here, a cluster when Ray is
already initialised against one). In hybrid mode (engines share the trainer's devices) the engines are woken
before the rollout and put to sleep after it. ``update_weights`` may be called while ``generate`` runs: by default
(``weight_update_pause="none"``) the engines receive the weights while they keep generating and swap them in
between two decode steps, each token carrying the version that produced it; with "abort" they pause, take the new
weights, resume, and the loops continue from the tokens they had (partial rollout; see generation.py); "keep" and
"wait" pause in those modes. Control calls go through a Fleet: the first in-process worker's Router's, or (Ray
workers have their own Routers) one of the manager's own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentloop_grpc.common.types import NamedTensor, PauseMode
from agentloop_grpc.router import ExpectedVersion, Fleet

from .loop_player import LoopPlayer, WorkerRun
from .metrics import RolloutMetrics
from .player import Player
from .routing_check import check_engine_routing
from .sample import Sample
from .spec import WeightUpdatePause, WorkerSpec, build_worker, load_codec
from .tokenizer_check import check_engine_tokenizers
from .trajectory import Trajectory
from .weight_transfer import StreamTransfer, WeightTransfer, choose_weight_transfer

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentloop_grpc.router import Router

@dataclass(frozen=True, slots=True)
class RolloutBatch:
    trajectories: tuple[Trajectory, ...]
    metrics: RolloutMetrics


class AgentLoopManager:
    def __init__(self, spec: WorkerSpec, num_workers: int = 1, use_ray: bool = False, hybrid: bool = False) -> None:
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        self.spec = spec
        self.num_workers = num_workers
        self.use_ray = use_ray
        self.hybrid = hybrid
        self._stack = AsyncExitStack()
        self._actors: list = []
        self._loops: LoopPlayer | None = None  # the workers' loops, the default player
        self._router: Router | None = None
        self.control: Fleet | None = None
        self._fleets: list[Fleet] = []
        # the engines' weight version, one for every Fleet here: a version any of them learns (a push through
        # ``control``, a server's report, a generation's tokens) holds out the servers below it in all of them
        self._expected = ExpectedVersion()
        self._tokenizer_checked = False
        self._tokenizer: PreTrainedTokenizerBase | None = None  # the loops' tokenizer, loaded once for the check
        self._weights: WeightTransfer | None = None  # chosen at the first update: a group needs serving engines

    async def __aenter__(self) -> AgentLoopManager:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def start(self) -> None:
        if self.use_ray:
            import ray

            from .ray_worker import RayAgentLoopWorker

            if not ray.is_initialized():
                ray.init(include_dashboard=False, log_to_driver=False)
            actor = ray.remote(num_cpus=0)(RayAgentLoopWorker)
            self._actors = [actor.remote(self.spec, i) for i in range(self.num_workers)]
            await _gather_refs([a.start.remote() for a in self._actors])
            self._loops = LoopPlayer([_actor_run(a) for a in self._actors])
            # the actors' own Routers are the data path; this Fleet carries control calls (wake, sleep, weights)
            self.control = await self._stack.enter_async_context(self.spec.make_fleet(self._expected))
            self._fleets.append(self.control)
        else:
            runs: list[WorkerRun] = []
            for i in range(self.num_workers):
                worker, router = await build_worker(self.spec, self._stack, i, self._expected)
                runs.append(worker.run)
                self._fleets.append(router.fleet)
                self.control = self.control or router.fleet
                self._router = self._router or router
            self._loops = LoopPlayer(runs)

    @property
    def router(self) -> Router:
        """The Router whose Fleet is ``control`` (the first in-process worker's): what else generates through it
        shares the workers' sessions, failover, weight versions and pauses. Ray workers keep theirs: RuntimeError."""
        if self._router is None:
            raise RuntimeError("the manager has no Router in this process (Ray workers, or not started)")
        return self._router

    @property
    def weight_transfer(self) -> str:
        """How ``update_weights`` moves the tensors: "collective", "path" or "stream" (``weight_transfer.py``);
        the spec's choice ("auto" included) until the first update made it."""
        return self._weights.name if self._weights is not None else self.spec.weight_transfer

    @property
    def fleets(self) -> tuple[Fleet, ...]:
        """The Fleets in this process: the in-process workers' Routers', or the control one (Ray workers have
        theirs)."""
        return tuple(self._fleets)

    async def close(self) -> None:
        if self._weights is not None:
            await self._weights.close(self.control)
        if self._actors:
            import ray

            await _gather_refs([a.close.remote() for a in self._actors])
            for actor in self._actors:
                ray.kill(actor)
            self._actors = []
        await self._stack.aclose()

    async def generate(
        self, samples: Sequence[Sample], on_done: Callable[[Trajectory], None] | None = None,
        player: Player | None = None, rows: Sequence[Mapping[str, Any]] | None = None,
    ) -> RolloutBatch:
        """Roll out every sample; trajectories come back in the samples' order. ``player``: who plays them (default:
        the workers' loops; an agent of your own: ``integrations/gateway_player.py``), with the same wake, sleep
        and checks around; ``rows``: the samples' dataset rows, for a player that hands them on."""
        ids = [s.sample_id for s in samples]
        if len(set(ids)) != len(ids):
            raise ValueError("sample ids must be unique in a batch (they are the router's session ids)")
        if self._loops is None or self.control is None:
            raise RuntimeError("the manager is not started")
        started = time.monotonic()
        if self.hybrid:
            (await self.control.wake_up()).raise_for_errors()
        await self.check_tokenizer()
        try:
            trajectories = await (player or self._loops).play(samples, rows, on_done)
        finally:
            if self.hybrid:
                (await self.control.sleep()).raise_for_errors()
        return RolloutBatch(tuple(trajectories), RolloutMetrics.of(trajectories, time.monotonic() - started))

    async def check_tokenizer(self) -> None:
        """Refuse engines whose tokenizer is not the loops' (TokenizerMismatchError), and, when the loops record
        routed experts, engines that cannot report them (RoutingUnavailableError); done once, before the first
        rollout, on every server that answers and has loaded its model."""
        if self._tokenizer_checked:
            return
        infos = (await self.control.server_info()).responses
        if self.spec.loop.return_routed_experts:
            check_engine_routing(infos)
        if self._tokenizer is None:
            self._tokenizer = (await asyncio.to_thread(load_codec, self.spec.model_dir)).tokenizer
        self._tokenizer_checked = check_engine_tokenizers(self._tokenizer, infos, self.spec.model_dir) > 0

    async def update_weights(self, tensors: Sequence[NamedTensor], weight_version: int,
                             leave_out_unreachable: bool = False) -> frozenset[str]:
        """Update every engine's weights, also while ``generate`` runs (see ``update_weights_mid_rollout``);
        ``leave_out_unreachable``: the engines that do not answer are left out (returned) instead of failing it."""
        if self._weights is None:
            self._weights = await choose_weight_transfer(
                self.spec.weight_transfer, self.control, self.spec.weights_dir, self.spec.weight_group_address,
                timeout_s=self.spec.weight_group_timeout_s,
            )
        return await update_weights_mid_rollout(
            self.control, tensors, weight_version, self._weights, self.spec.weight_update_pause, leave_out_unreachable,
        )


async def update_weights_mid_rollout(
    control: Fleet, tensors: Sequence[NamedTensor], weight_version: int, transfer: WeightTransfer | None = None,
    pause: WeightUpdatePause = "abort", leave_out_unreachable: bool = False,
) -> frozenset[str]:
    """Update every engine's weights (by ``transfer``; default: stream) while loops run; return the engines left
    out.

    ``pause="none"``: no pause; each engine stages the update while generating and swaps it in between two steps.
    Otherwise Pause(``pause``) -> transfer -> Resume; running loops keep their tokens and go on. Whatever fails,
    every engine is resumed before the error is raised: an engine left paused holds each later generation until its
    deadline. When some engine is down (it cannot pause, or answer), nothing is applied anywhere, so the engines
    that are up keep one weight version between them; unless ``leave_out_unreachable``: then the engines that do
    not answer GetServerInfo are left out (a trainer goes on with the others) and, being behind the fleet's version
    from then on, are held out of routing should they come back, until an update reaches them.
    """
    transfer = transfer or StreamTransfer()
    infos = await control.server_info()
    servers: frozenset[str] | None = None
    if leave_out_unreachable and infos.responses:
        servers = frozenset(infos.responses)
        if infos.errors:
            log.warning("weight version %d leaves out %d engine(s) that do not answer: %s", weight_version,
                        len(infos.errors), "; ".join(f"{a}: {e}" for a, e in sorted(infos.errors.items())))
    else:
        infos.raise_for_errors()
    left_out = frozenset(infos.errors) if servers is not None else frozenset()
    if pause == "none":
        (await transfer.push(control, tensors, weight_version, servers)).raise_for_errors()
        return left_out
    paused = await control.pause(PauseMode(pause), servers)
    try:
        paused.raise_for_errors()
        (await transfer.push(control, tensors, weight_version, servers)).raise_for_errors()
    finally:
        resumed = await control.resume(servers)
    resumed.raise_for_errors()
    return left_out


async def _gather_refs(refs: list) -> list:
    return list(await asyncio.gather(*refs))


def _actor_run(actor: Any) -> WorkerRun:
    """A Ray worker's run: its trajectories come back together, so ``on_done`` sees them as the chunk ends."""

    async def run(samples: list[Sample], on_done: Callable[[Trajectory], None] | None) -> list[Trajectory]:
        trajectories = list(await actor.run.remote(samples))
        for trajectory in trajectories:
            if on_done is not None:
                on_done(trajectory)
        return trajectories

    return run
