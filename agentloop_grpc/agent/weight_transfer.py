"""How new weights reach the engines: broadcast once over a collective, written once as a checkpoint they load,
or streamed over gRPC to each.

``collective`` (JoinWeightGroup + ReceiveWeights) forms a torch.distributed group of this process (rank 0) and
every engine worker, announces each update over gRPC and broadcasts the bytes once for all of them (gloo on
CPUs, NCCL between GPUs). ``path`` (LoadWeights) writes one safetensors file to a folder every engine can read
and sends each engine only its name. ``stream`` (UpdateWeights) works anywhere but sends the bytes once per
engine through gRPC. ``auto`` takes the first that works: collective when the group forms, else path when every
engine is on this machine (or ``weights_dir`` says they share storage), else stream. The choice is logged once,
when made, which is at the first update (the engines must be serving to join a group).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import grpc

from agentloop_grpc.common.addresses import is_loopback, local_address_towards
from agentloop_grpc.common.safetensors_format import write_safetensors
from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.common.weight_layout import (
    DEFAULT_BUCKET_BYTES,
    DEFAULT_TIMEOUT_S,
    BucketLayout,
    TensorSpec,
    WeightGroupError,
    WeightGroupSpec,
)
from agentloop_grpc.router import FanOutResult, Fleet
from agentloop_grpc.v1 import engine_pb2

if TYPE_CHECKING:
    from agentloop_grpc.common.weight_group import WeightGroupLeader

log = logging.getLogger(__name__)

#: How long past the group's timeout a member may take to report a failed broadcast before it counts as lost.
LOST_MARGIN_S = 5.0

WeightTransferKind = Literal["auto", "collective", "stream", "path"]


class WeightTransfer(Protocol):
    @property
    def name(self) -> str:  # read-only: the transfers are frozen dataclasses
        ...

    async def push(self, fleet: Fleet, tensors: Sequence[NamedTensor], weight_version: int,
                   servers: Collection[str] | None = None) -> FanOutResult:
        """Apply ``tensors`` as ``weight_version`` on every server of ``fleet`` (those in ``servers``)."""
        ...

    async def close(self, fleet: Fleet) -> None:
        """Release what the transfer holds (a group, a folder)."""
        ...


@dataclass(frozen=True)
class StreamTransfer:
    name: str = "stream"

    async def push(self, fleet: Fleet, tensors: Sequence[NamedTensor], weight_version: int,
                   servers: Collection[str] | None = None) -> FanOutResult:
        return await fleet.update_weights(tensors, weight_version, servers=servers)

    async def close(self, fleet: Fleet) -> None:
        """Nothing held."""


@dataclass(frozen=True)
class PathTransfer:
    """Writes each update to ``folder`` (read by every engine), has the engines load it, then removes it."""

    folder: Path
    name: str = "path"

    async def push(self, fleet: Fleet, tensors: Sequence[NamedTensor], weight_version: int,
                   servers: Collection[str] | None = None) -> FanOutResult:
        file = self.folder / f"weights-v{weight_version}.safetensors"
        await asyncio.to_thread(write_safetensors, file, tensors)
        try:
            return await fleet.load_weights(str(file), weight_version, servers=servers)
        finally:
            file.unlink(missing_ok=True)

    async def close(self, fleet: Fleet) -> None:
        """The folder is the caller's (or a temporary one, emptied after each update)."""


@dataclass
class CollectiveTransfer:
    """Broadcasts each update over a weight-transfer group of this process and every engine worker.

    The group forms at the first push (and again after a broadcast failed or the fleet's servers changed):
    this process hosts the rendezvous on ``address`` (as the engines reach it), every server joins with its
    workers. Each update is announced to every server (ReceiveWeights), then broadcast in pieces of
    ``bucket_bytes``; the servers vote first, so a refused update moves no byte and changes nothing anywhere.
    """

    address: str
    backend: str = "gloo"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S
    name: str = "collective"
    _leader: WeightGroupLeader | None = field(default=None, repr=False)
    _group: str = ""
    _members: frozenset[str] = frozenset()

    @property
    def group(self) -> str | None:
        """The group's name while one is formed."""
        return self._group if self._leader is not None else None

    @property
    def members(self) -> frozenset[str]:
        """The servers in the group (their addresses)."""
        return self._members if self._leader is not None else frozenset()

    async def form(self, fleet: Fleet, servers: Collection[str] | None = None) -> None:
        """Form the group with every server of ``fleet`` (those in ``servers``); WeightGroupError (nothing left
        behind) if it cannot."""
        from agentloop_grpc.common.weight_group import WeightGroupLeader  # torch: imported only by trainers using it

        await self.close(fleet)
        infos = await fleet.server_info()
        wanted = set(fleet.servers) if servers is None else set(servers)
        errors = sorted(set(infos.errors) & wanted)
        answered = {a: info for a, info in infos.responses.items() if a in wanted}
        if errors or not answered:
            raise WeightGroupError(f"not every engine answered GetServerInfo: {errors or 'no engines'}")
        offsets, world = {}, 1
        for address, info in sorted(answered.items()):
            if info.weight_group_ranks < 1:
                raise WeightGroupError(f"the {info.engine_kind} engine at {address} cannot join a weight group")
            offsets[address], world = world, world + info.weight_group_ranks
        group = f"agentloop-{uuid.uuid4().hex[:12]}"
        store, port = await asyncio.to_thread(WeightGroupLeader.host, self.address, world, self.timeout_s)
        spec = WeightGroupSpec(group, self.address, port, world, 0, self.backend, self.timeout_s)
        leading = asyncio.ensure_future(asyncio.to_thread(WeightGroupLeader.form, store, spec))
        joined = await fleet.join_weight_group(group, self.address, port, world, offsets, self.backend, self.timeout_s)
        try:
            leader = await leading
        except WeightGroupError:
            await fleet.leave_weight_group(group, offsets.keys())
            raise WeightGroupError(_join_errors(joined)) from None
        if joined.errors:  # the group formed without them? impossible; leave nothing half-made
            await asyncio.to_thread(leader.close)
            await fleet.leave_weight_group(group, offsets.keys())
            raise WeightGroupError(_join_errors(joined))
        self._leader, self._group, self._members = leader, group, frozenset(offsets)
        log.info("weight group %s formed at %s:%d: %d engines, %d ranks, %s", group, self.address, port,
                 len(offsets), world, self.backend)

    async def push(self, fleet: Fleet, tensors: Sequence[NamedTensor], weight_version: int,
                   servers: Collection[str] | None = None) -> FanOutResult:
        wanted = frozenset(fleet.servers if servers is None else servers)
        if self._leader is not None:
            # every member answers before the bytes move: a broadcast with a member gone waits out the timeout
            answered = await fleet.server_info()
            if set(answered.errors) & wanted:
                await self.close(fleet)
                return answered
            if self._members != wanted:
                await self.close(fleet)
        if self._leader is None:
            await self.form(fleet, wanted)
        specs = [TensorSpec(t.name, t.dtype, tuple(t.shape)) for t in tensors]
        layout = BucketLayout.of(specs, self.bucket_bytes)
        # one call per member: when the broadcast fails, each answers on its own (a lost one never does); the
        # versions are recorded once all answered, so the first to apply does not hold out the others
        receiving = {address: asyncio.ensure_future(fleet.receive_weights(
            self._group, specs, self.bucket_bytes, weight_version, servers={address}, record_versions=False
        )) for address in sorted(self._members)}
        try:
            await asyncio.to_thread(self._send, layout, [t.data for t in tensors])
        except WeightGroupError as error:
            log.warning("the broadcast over weight group %s failed; it forms again at the next update", self._group)
            return await self._fail(fleet, receiving, error)
        result = _merged({a: await call for a, call in receiving.items()})
        fleet.record_weight_versions(result)
        return result

    async def _fail(self, fleet: Fleet, receiving: Mapping[str, asyncio.Future[FanOutResult]],
                    error: WeightGroupError) -> FanOutResult:
        """After a failed broadcast: every member's collective fails by the group's timeout as this one's did (none
        applies the update: the commit never completed) and answers so. A member that does not answer by then and
        ``LOST_MARGIN_S``, or does not answer GetServerInfo within ``LOST_MARGIN_S`` after, is lost (its link down,
        its process stopped) and its error says so. The group is let go: the members that answer leave it (they did
        already when their receive failed), the lost ones leave by their own timeout."""
        _, pending = await asyncio.wait(receiving.values(), timeout=self.timeout_s + LOST_MARGIN_S)
        for call in pending:
            call.cancel()
        answers = {a: call.result() for a, call in receiving.items() if call not in pending}
        result = _merged(answers)
        fleet.record_weight_versions(result)
        probes = {a: fleet.endpoint(a).control.GetServerInfo(engine_pb2.GetServerInfoRequest(), timeout=LOST_MARGIN_S)
                  for a in sorted(self._members)}
        outcomes = dict(zip(probes, await asyncio.gather(*probes.values(), return_exceptions=True), strict=True))
        lost = {a for a, outcome in outcomes.items() if isinstance(outcome, BaseException)}
        for address in sorted(lost):
            how = f"its answer: {result.errors[address]}" if address in result.errors else "no answer"
            result.errors[address] = WeightGroupError(
                f"lost: does not answer (GetServerInfo: {_status(outcomes[address])}) since the broadcast over "
                f"weight group {self._group} failed ({error}); {how}"
            )
            log.warning("weight group %s: member %s lost", self._group, address)
        leader, self._leader = self._leader, None
        if leader is not None:
            await asyncio.to_thread(leader.close)
            await fleet.leave_weight_group(self._group, self._members - lost)
        return result

    def _send(self, layout: BucketLayout, sources: Sequence[bytes]) -> None:
        assert self._leader is not None
        if self._leader.vote(True):  # a member that refused answers its ReceiveWeights with why
            self._leader.send(layout, sources)

    async def close(self, fleet: Fleet) -> None:
        leader, self._leader = self._leader, None
        if leader is not None:
            await asyncio.to_thread(leader.close)
            await fleet.leave_weight_group(self._group, self._members)


def _status(error: object) -> str:
    return error.code().name if isinstance(error, grpc.aio.AioRpcError) else type(error).__name__


def _merged(results: dict[str, FanOutResult]) -> FanOutResult:
    """The one-server results of a call made per server, as one."""
    merged: FanOutResult = FanOutResult()
    for result in results.values():
        merged.responses.update(result.responses)
        merged.errors.update(result.errors)
    return merged


def _join_errors(joined: FanOutResult) -> str:
    described = "; ".join(f"{address}: {error}" for address, error in sorted(joined.errors.items()))
    return f"the weight group did not form ({described or 'no engine reported an error'})"


async def choose_weight_transfer(
    kind: WeightTransferKind, fleet: Fleet, folder: str | None = None, group_address: str | None = None,
    backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S,
) -> WeightTransfer:
    """The transfer ``kind`` names (a collective group is formed now, with ``timeout_s``: see
    ``WorkerSpec.weight_group_timeout_s``); ``auto``: collective if the group forms,
    else path when every engine is on this machine (or ``folder`` is given: the caller says the engines can read
    it), else stream."""
    addresses = list(fleet.servers)
    if kind in ("auto", "collective"):
        try:
            transfer = CollectiveTransfer(group_address or local_address_towards(addresses[0]), backend,
                                          timeout_s=timeout_s)
            await transfer.form(fleet)
        except (WeightGroupError, OSError, IndexError) as error:
            if kind == "collective":
                raise
            log.info("no weight group (%s); trying the next transfer", error)
        else:
            log.info("weight updates go to %d engines by collective (%s broadcast)", len(addresses), backend)
            return transfer
        kind = "path" if folder or (addresses and all(is_loopback(a) for a in addresses)) else "stream"
    if kind == "stream":
        log.info("weight updates go to %d engines by stream (UpdateWeights)", len(addresses))
        return StreamTransfer()
    return _path_transfer(addresses, folder)


def _path_transfer(addresses: Iterable[str], folder: str | None) -> PathTransfer:
    where = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="agentloop-weights-"))
    where.mkdir(parents=True, exist_ok=True)
    log.info("weight updates go to %d engines by path (LoadWeights from %s)", len(list(addresses)), where)
    return PathTransfer(where)
