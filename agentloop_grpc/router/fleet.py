"""Fleet: the engine servers a Router routes over, and the control calls fanned out to all of them.

One Endpoint per server (channel, health watch, load polls, liveness: endpoint.py), the fleet's weight version
and the servers held out below it (versions.py), and control calls (sleep, wake, pause, resume, flush, weight
updates, abort) sent to every server concurrently, each server's outcome reported apart, its answer in domain
types (fanout.py, replies.py). A trainer that only steers the engines holds a Fleet; a Router holds one to route
generate calls over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentloop_grpc.common import wire
from agentloop_grpc.common.types import ALL_RESOURCES, EngineState, NamedTensor, PauseMode, PauseResult, Resource
from agentloop_grpc.common.weight_layout import TensorSpec
from agentloop_grpc.v1 import engine_pb2, generation_pb2

from .config import RouterConfig
from .discovery import discovery_addresses, discovery_config
from .endpoint import Endpoint
from .errors import NoHealthyServerError
from .fanout import FanOutResult, Reply, tensor_specs, weight_update_messages
from .follow import follow_discovery_file
from .lowest_load import LowestLoad
from .metrics import RouterMetrics
from .replies import (
    ServerInfo,
    WeightsApplied,
    aborted,
    engine_state,
    memory_released,
    nothing,
    pause_result,
    ranks,
    server_info,
    weights_applied,
)
from .versions import ExpectedVersion, WeightVersions


class Fleet:
    """Engine servers and their control; see the module docstring. Use ``async with Fleet(...)``."""

    def __init__(self, servers: Sequence[str], config: RouterConfig | None = None,
                 discovery_file: str | Path | None = None, expected: ExpectedVersion | None = None) -> None:
        """``expected``: the fleet's weight version shared with other Fleets over the same engines (versions.py);
        None: this Fleet's own."""
        self.config = config or RouterConfig()
        self.metrics = RouterMetrics()
        self._endpoints: dict[str, Endpoint] = {}
        self._versions = WeightVersions(self.metrics, expected)
        self._lowest = LowestLoad()  # over the healthy servers, kept by their endpoints as loads change
        self._initial = list(servers)
        self._paused = False
        # the launcher's file the servers came from: followed while entered (follow.py)
        self._discovery_file = discovery_file
        self._follower: asyncio.Task | None = None

    @classmethod
    def from_discovery_file(cls, path: str | Path, config: RouterConfig | None = None,
                            expected: ExpectedVersion | None = None) -> Fleet:
        """Servers from a launcher's discovery file, reached with the file's security settings unless ``config``
        has its own; while entered, the file is followed (``RouterConfig.discovery_poll_s``)."""
        return cls(discovery_addresses(path), discovery_config(path, config), discovery_file=path, expected=expected)

    async def __aenter__(self) -> Fleet:
        for address in self._initial:
            await self.add_server(address)
        if self._discovery_file is not None and self.config.discovery_poll_s > 0:
            self._follower = asyncio.create_task(
                follow_discovery_file(self, self._discovery_file, self.config.discovery_poll_s))
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        for address in list(self._endpoints):
            await self.remove_server(address)

    # -- servers ---------------------------------------------------------------------------------------------

    @property
    def servers(self) -> dict[str, Endpoint]:
        return dict(self._endpoints)

    def endpoint(self, address: str) -> Endpoint:
        return self._endpoints[address]

    async def add_server(self, address: str) -> None:
        if address in self._endpoints:
            return
        endpoint = Endpoint(address, self.config, self.metrics, self._versions, self._lowest)
        self._endpoints[address] = endpoint
        endpoint.start()

    async def remove_server(self, address: str) -> None:
        """Stop routing to ``address``; its sessions move on their next request. In-flight calls are cancelled."""
        endpoint = self._endpoints.pop(address, None)
        if endpoint is not None:
            await endpoint.close()
            self._versions.forget(address)

    async def wait_ready(self, min_servers: int = 1, timeout_s: float = 60.0) -> None:
        """Wait until at least ``min_servers`` servers report SERVING (whatever their weight version)."""
        deadline = time.monotonic() + timeout_s
        while sum(e.healthy for e in self._endpoints.values()) < min_servers:
            if time.monotonic() > deadline:
                raise NoHealthyServerError(f"fewer than {min_servers} servers became healthy within {timeout_s} s")
            await asyncio.sleep(0.02)

    async def routable_loads(self, until: float, avoid: Collection[str] = ()) -> dict[str, int]:
        """The load of every server that takes new requests (healthy, with the fleet's weights), leaving out those
        in ``avoid`` (which just failed a request) unless no other can; waits until ``until`` for one."""
        while True:
            behind = self._versions.behind
            loads = {a: e.load for a, e in self._endpoints.items() if e.healthy and a not in behind}
            if avoid:
                loads = {a: load for a, load in loads.items() if a not in avoid} or loads
            if loads:
                return loads
            if time.monotonic() >= until:
                held = f"; held out below weight version {self._versions.expected}: {sorted(behind)}" if behind else ""
                raise NoHealthyServerError(f"no healthy engine server among {sorted(self._endpoints)}{held}")
            await asyncio.sleep(0.02)

    def sticky_loads(self, address: str) -> tuple[int, int] | None:
        """The load of ``address`` and the lowest load of the servers that take new requests, while ``address`` is
        one of them and no server is held out for its weights; None otherwise (then ``routable_loads`` decides).
        O(1), for the sticky call that most generate calls are (policy.keeps)."""
        endpoint = self._endpoints.get(address)
        if endpoint is None or not endpoint.healthy or self._versions.behind:
            return None
        return endpoint.load, self._lowest.value  # type: ignore[return-value]  # endpoint is healthy: counted

    @property
    def max_model_len(self) -> int | None:
        """The context length the servers reported (the smallest, should they differ); None before any did."""
        lengths = [e.info.max_model_len for e in self._endpoints.values()
                   if e.info is not None and e.info.max_model_len]
        return min(lengths, default=None)

    # -- weight versions -------------------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        """The fleet's weight version as this Fleet knows it (see versions.py)."""
        return self._versions.expected

    @property
    def held_out(self) -> frozenset[str]:
        """Servers held out of routing for serving an older weight version than the fleet's."""
        return self._versions.behind

    def produced_with(self, address: str, version: int) -> None:
        """``address`` finished a generation with weight ``version`` (news when higher than it reported)."""
        self._versions.advance(address, version)

    # -- fan-out control -------------------------------------------------------------------------------------

    async def _fan_out(
        self, call: Callable[[Endpoint], Awaitable[Any]], reply: Callable[[Any], Reply],
        only: Collection[str] | None = None,
    ) -> FanOutResult[Reply]:
        """``call`` on every server (those in ``only``), each answer read by ``reply`` into domain types."""
        endpoints = [e for a, e in self._endpoints.items() if only is None or a in only]
        outcomes = await asyncio.gather(*(call(e) for e in endpoints), return_exceptions=True)
        result: FanOutResult[Reply] = FanOutResult()
        for endpoint, outcome in zip(endpoints, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                result.errors[endpoint.address] = outcome
            else:
                result.responses[endpoint.address] = reply(outcome)
        return result

    async def abort(self, request_ids: Mapping[str, Sequence[str]]) -> FanOutResult[tuple[str, ...]]:
        """Abort requests (server address -> request ids) on their servers; their streams end with ABORT. Each
        server answers the ids it aborted (those still in flight)."""
        return await self._fan_out(
            lambda e: e.generate.Abort(
                generation_pb2.AbortRequest(request_ids=request_ids[e.address]), timeout=self.config.control_timeout_s
            ),
            aborted, only=request_ids,
        )

    async def abort_all(self) -> FanOutResult[tuple[str, ...]]:
        """Abort every in-flight request on every server (other clients' too); each answers the ids it aborted."""
        return await self._fan_out(
            lambda e: e.generate.Abort(generation_pb2.AbortRequest(all=True), timeout=self.config.control_timeout_s),
            aborted,
        )

    async def server_info(self) -> FanOutResult[ServerInfo]:
        result = await self._fan_out(
            lambda e: e.control.GetServerInfo(engine_pb2.GetServerInfoRequest(), timeout=self.config.control_timeout_s),
            server_info,
        )
        self._report_versions(result)
        return result

    async def sleep(self, level: int = 1) -> FanOutResult[bool]:
        """Release the KV cache (level 1), or the KV cache and the weights (level 2); each server answers whether
        the memory was released (an engine that cannot release it still sleeps)."""
        request = engine_pb2.SleepRequest(level=wire.SLEEP_LEVELS[level])
        return await self._fan_out(
            lambda e: e.control.Sleep(request, timeout=self.config.control_timeout_s), memory_released
        )

    async def wake_up(self, resources: Iterable[Resource] = ALL_RESOURCES) -> FanOutResult[EngineState | None]:
        """Restore what Sleep released; each server answers its state."""
        request = engine_pb2.WakeUpRequest(tags=[wire.RESOURCE_TAGS[r] for r in resources])
        return await self._fan_out(
            lambda e: e.control.WakeUp(request, timeout=self.config.control_timeout_s), engine_state
        )

    @property
    def paused(self) -> bool:
        """True from this fleet's ``pause`` until its ``resume``: the engines hold new generations (a weight
        update), which front ends that must not wait (the session gateway's ``when_paused: retry``) ask."""
        return self._paused

    async def pause(self, mode: PauseMode = PauseMode.ABORT,
                    servers: Collection[str] | None = None) -> FanOutResult[PauseResult]:
        """Pause every server (those in ``servers``)."""
        request = engine_pb2.PauseRequest(mode=wire.PAUSE_MODES[mode])
        self._paused = True  # before the calls: a request arriving meanwhile meets a pausing engine
        return await self._fan_out(
            lambda e: e.control.Pause(request, timeout=self.config.control_timeout_s), pause_result, only=servers
        )

    async def resume(self, servers: Collection[str] | None = None) -> FanOutResult[EngineState | None]:
        try:
            return await self._fan_out(
                lambda e: e.control.Resume(engine_pb2.ResumeRequest(), timeout=self.config.control_timeout_s),
                engine_state, only=servers,
            )
        finally:
            self._paused = False

    async def flush_cache(self) -> FanOutResult[None]:
        return await self._fan_out(
            lambda e: e.control.FlushCache(engine_pb2.FlushCacheRequest(), timeout=self.config.control_timeout_s),
            nothing,
        )

    async def update_weights(
        self, tensors: Iterable[NamedTensor], weight_version: int | None = None, flush_cache: bool = True,
        servers: Collection[str] | None = None,
    ) -> FanOutResult[WeightsApplied]:
        """Stream the same tensors to every server (those in ``servers``) concurrently; each applies them
        atomically on the commit. The version the servers answer becomes the fleet's: a server that missed it is
        held out until it has it."""
        messages = weight_update_messages(tensors, weight_version, flush_cache, self.config.weight_chunk_bytes)

        async def send(endpoint: Endpoint):
            async def stream():
                for message in messages:
                    yield message

            return await endpoint.control.UpdateWeights(stream(), timeout=self.config.control_timeout_s)

        return await self._apply_weights(send, servers)

    async def load_weights(
        self, path: str, weight_version: int | None = None, flush_cache: bool = True,
        servers: Collection[str] | None = None,
    ) -> FanOutResult[WeightsApplied]:
        """Have every server load the safetensors checkpoint at ``path`` (a file or folder each server can read,
        e.g. on shared storage): one small call each, the bytes never cross gRPC. Versions as ``update_weights``."""
        request = engine_pb2.LoadWeightsRequest(path=path, flush_cache=flush_cache)
        if weight_version is not None:
            request.weight_version = weight_version
        return await self._apply_weights(
            lambda e: e.control.LoadWeights(request, timeout=self.config.control_timeout_s), servers)

    async def join_weight_group(
        self, group: str, master_address: str, master_port: int, world_size: int,
        rank_offsets: Mapping[str, int], backend: str = "gloo", timeout_s: float = 0.0,
    ) -> FanOutResult[tuple[int, ...]]:
        """Have each server (the keys of ``rank_offsets``) join the weight-transfer group the trainer hosts at
        ``master_address:master_port``, its workers from its rank offset on. The calls return once the group
        formed, so the trainer joins as rank 0 while they wait (``agent/weight_transfer.py``); each answers its
        ranks in the group."""

        def join(endpoint: Endpoint):
            request = engine_pb2.JoinWeightGroupRequest(
                group_name=group, master_address=master_address, master_port=master_port, world_size=world_size,
                rank_offset=rank_offsets[endpoint.address], backend=backend, timeout_s=timeout_s,
            )
            # the call waits for the group to form (up to timeout_s), then answers
            return endpoint.control.JoinWeightGroup(request, timeout=timeout_s + self.config.control_timeout_s)

        return await self._fan_out(join, ranks, only=rank_offsets.keys())

    async def receive_weights(
        self, group: str, tensors: Sequence[TensorSpec], bucket_bytes: int,
        weight_version: int | None = None, flush_cache: bool = True, servers: Collection[str] | None = None,
        record_versions: bool = True,
    ) -> FanOutResult[WeightsApplied]:
        """Announce an update to the servers of ``group`` (``servers``; None: all); each receives what the trainer
        broadcasts next and applies it (versions as ``update_weights``). ``record_versions=False``: for an update
        sent to each server by a call of its own, whose caller records the answers together once all are in
        (``record_weight_versions``), so that the first server to answer does not hold out the others."""
        request = engine_pb2.ReceiveWeightsRequest(
            group_name=group, tensors=tensor_specs(tensors), bucket_bytes=bucket_bytes, flush_cache=flush_cache
        )
        if weight_version is not None:
            request.weight_version = weight_version

        def receive(endpoint: Endpoint):
            return endpoint.control.ReceiveWeights(request, timeout=self.config.control_timeout_s)

        if record_versions:
            return await self._apply_weights(receive, servers)
        return await self._fan_out(receive, weights_applied, only=servers)

    async def leave_weight_group(self, group: str, servers: Collection[str] | None = None) -> FanOutResult[None]:
        request = engine_pb2.LeaveWeightGroupRequest(group_name=group)
        return await self._fan_out(
            lambda e: e.control.LeaveWeightGroup(request, timeout=self.config.control_timeout_s), nothing,
            only=servers,
        )

    async def _apply_weights(self, call: Callable[[Endpoint], Awaitable[Any]],
                             servers: Collection[str] | None) -> FanOutResult[WeightsApplied]:
        """A weight update fanned out to ``servers`` (None: all); the versions the servers answer become the
        fleet's."""
        result = await self._fan_out(call, weights_applied, only=servers)
        self._report_versions(result)
        return result

    def record_weight_versions(self, result: FanOutResult[WeightsApplied]) -> None:
        """Record the versions of an update's answers, gathered from calls made with ``record_versions=False``."""
        self._report_versions(result)

    def _report_versions(self, result: FanOutResult[ServerInfo] | FanOutResult[WeightsApplied]) -> None:
        """Record the weight versions in the answers of a fan-out (GetServerInfo, UpdateWeights, LoadWeights)."""
        self._versions.report_all({
            address: response.weight_version for address, response in result.responses.items()
            if address in self._endpoints
        })

