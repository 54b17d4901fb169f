"""One engine server of a verl rollout replica, as verl's server actor: a Ray actor that starts ``agentloop engine
serve`` on its node (or attaches to a server already running) and answers the calls verl makes on its servers.

verl's own client (``LLMServerClient`` with its load balancer) calls ``generate(request_id, prompt_ids,
sampling_params, ...) -> TokenOutput`` on the actor: it goes to the engine over gRPC through
``AgentloopLLMClient`` (the same sampling and stop-reason mapping). verl's replica calls map onto EngineControl:

| verl call | EngineControl |
|---|---|
| ``wake_up`` | WakeUp (weights and KV cache), FlushCache (the cache was computed with the old weights) |
| ``sleep`` | Sleep(KV_CACHE_AND_WEIGHTS) hybrid, Sleep(KV_CACHE) colocated, nothing standalone (as verl's own) |
| ``abort_all_requests`` | Pause(ABORT): in-flight requests answer 'aborted' with their tokens so far; new ones wait |
| ``resume_generation`` | Resume |
| ``clear_kv_cache`` | FlushCache |
| ``release_kv_cache`` / ``resume_kv_cache`` | Sleep(KV_CACHE) / WakeUp(KV_CACHE) + FlushCache |

Sleep needs nothing in flight: calls aborted a moment earlier may still be leaving, so it is retried until they
have. ``abort_all_requests(reject_request=True)`` also answers calls made through this actor 'aborted' at once
instead of holding them until ``resume_generation`` (verl's replica is leaving its balancer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import grpc

from agentloop_grpc.common.types import PauseMode, Resource
from agentloop_grpc.launch.launcher import EngineLaunch, ServerProcess
from agentloop_grpc.router import Fleet

#: How long Sleep waits for aborted calls to leave the engine.
_SLEEP_RETRY_S = 60.0


class EngineServerActor:
    """Ray actor (``ray.remote(EngineServerActor)``): see the module docstring.

    ``launch`` starts a server on this node; ``address`` attaches to one already running. ``rollout_mode`` is
    verl's (hybrid, colocated, standalone), ``trainer_config`` verl's whole config (its rollout's lengths bound
    each generation as verl's own servers do)."""

    def __init__(self, trainer_config: Any, rollout_mode: str, free_cache_engine: bool = True,
                 launch: EngineLaunch | None = None, address: str | None = None, log_dir: str = "",
                 startup_timeout_s: float = 600.0, env: dict[str, str] | None = None) -> None:
        if (launch is None) == (address is None):
            raise ValueError("EngineServerActor needs exactly one of launch= and address=")
        self._trainer_config = trainer_config
        self._mode = rollout_mode
        self._free_cache_engine = free_cache_engine
        self._launch = launch
        self._address = address
        self._log_dir = log_dir
        self._startup_timeout_s = startup_timeout_s
        self._env = dict(env or {})  # e.g. CUDA_VISIBLE_DEVICES: the GPUs of verl's workers in hybrid mode
        self._process: ServerProcess | None = None
        self._fleet: Fleet | None = None
        self._client = None
        self._open = asyncio.Event()  # the submission gate: closed between abort_all_requests and resume
        self._open.set()
        self._rejecting = False

    async def start(self) -> str:
        """Start (or attach to) the server; its gRPC address once it is SERVING."""
        import ray

        from .client import AgentloopLLMClient

        if self._launch is not None:
            host = ray.util.get_node_ip_address()
            launch = dataclasses.replace(self._launch, host=host)
            actor_id = ray.get_runtime_context().get_actor_id()
            log_path = Path(self._log_dir or "/tmp/agentloop-verl") / f"engine-{actor_id}.log"
            self._process = ServerProcess(launch.command(0), log_path, env=self._env, terminate_with_parent=True,
                                          security=launch.client_security)
            self._address = await self._process.start(self._startup_timeout_s)
        self._fleet = await Fleet([self._address]).__aenter__()
        self._client = AgentloopLLMClient(self._trainer_config, servers=[self._address])
        return self._address

    async def stop(self, grace_s: float = 10.0) -> None:
        if self._client is not None:
            await self._client.close()
        if self._fleet is not None:
            await self._fleet.close()
        if self._process is not None:
            await self._process.stop(grace_s)

    def address(self) -> str | None:
        return self._address

    # -- verl's generate ---------------------------------------------------------------------------------------

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data=None, video_data=None, **kwargs: Any):
        from verl.workers.rollout.replica import TokenOutput

        while not self._open.is_set():
            if self._rejecting:  # the replica leaves the balancer: the caller re-routes
                return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted")
            await self._open.wait()  # wakes on resume_generation
        return await self._client.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                                           image_data=image_data, video_data=video_data, **kwargs)

    # -- verl's control calls ----------------------------------------------------------------------------------

    async def wake_up(self) -> None:
        if self._mode == "standalone":
            return
        (await self._fleet.wake_up()).raise_for_errors()
        (await self._fleet.flush_cache()).raise_for_errors()

    async def sleep(self) -> None:
        if self._mode == "standalone" or not self._free_cache_engine:
            return
        await sleep_when_idle(self._fleet, 2 if self._mode == "hybrid" else 1)

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        self._rejecting = reject_request
        self._open.clear()
        result = (await self._fleet.pause(PauseMode.ABORT)).raise_for_errors()
        return {"aborted_count": sum(r.aborted_requests for r in result.responses.values())}

    async def resume_generation(self) -> None:
        (await self._fleet.resume()).raise_for_errors()
        self._rejecting = False
        self._open.set()

    async def clear_kv_cache(self) -> None:
        (await self._fleet.flush_cache()).raise_for_errors()

    async def release_kv_cache(self) -> None:
        if self._free_cache_engine and self._mode != "colocated":
            await sleep_when_idle(self._fleet, 1)

    async def resume_kv_cache(self) -> None:
        if self._free_cache_engine and self._mode != "colocated":
            (await self._fleet.wake_up([Resource.KV_CACHE])).raise_for_errors()
            (await self._fleet.flush_cache()).raise_for_errors()

    async def start_profile(self, **kwargs: Any) -> None:
        """No profiler is exposed over EngineControl; verl's call is accepted and does nothing."""

    async def stop_profile(self) -> None:
        """See ``start_profile``."""


async def sleep_when_idle(fleet: Fleet, level: int) -> None:
    """Sleep(``level``) on every server of ``fleet``, retried while calls aborted a moment earlier still leave."""
    deadline = time.monotonic() + _SLEEP_RETRY_S
    while True:
        result = await fleet.sleep(level)
        error = next(iter(result.errors.values()), None)
        if error is None:
            return
        in_flight = isinstance(error, grpc.aio.AioRpcError) and error.code() is grpc.StatusCode.FAILED_PRECONDITION
        if not in_flight or time.monotonic() > deadline:
            result.raise_for_errors()
        await asyncio.sleep(0.05)
