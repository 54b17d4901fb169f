"""Weight-transfer groups: a trainer (rank 0) broadcasts weights to every engine worker at once.

Both ends live here because they must agree byte for byte: ``WeightGroupLeader`` is the trainer's side (it hosts
the rendezvous and sends), ``WeightGroupMember`` an engine worker's (it joins and receives). The group is a
process group of its own (``ProcessGroupGloo`` or ``ProcessGroupNCCL`` over a ``TCPStore`` the trainer hosts),
never torch's default one: an engine worker may already be in one (vLLM's and SGLang's tensor parallelism).

An update is announced first and then broadcast as ``weight_layout.BucketLayout`` says. A member receives every
piece straight into one flat buffer and reads each tensor as a view of it, so receiving costs no copy. Before
the bytes move, every rank votes (an all-reduce of 0 or 1): if any member refuses the update
(a tensor its model does not have, a stale version), nobody receives and nothing is applied anywhere. After the
last piece every rank takes part in one more all-reduce (the commit): a member hands the bytes on to be applied only
once it completed, that is once every rank has every byte, so a rank lost mid-broadcast (a partition, a crash)
fails the update on every member, each at the group's timeout at the latest, and none applies it.

Gloo's sockets bind the address on the route to the rendezvous (the leader: the rendezvous address itself), not
the one this host's name resolves to: that is often 127.0.0.1 (``/etc/hosts``), which peers on other machines
cannot reach. ``GLOO_SOCKET_IFNAME`` (an interface name), when set, chooses instead, as in torch.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .addresses import local_address_towards
from .weight_layout import DEFAULT_TIMEOUT_S, BucketLayout, WeightGroupError, WeightGroupSpec


def _process_group(
    store: dist.Store, rank: int, world_size: int, backend: str, timeout_s: float, local: str
) -> Any:  # a c10d backend: torch's stubs declare none of its collectives
    """The group's process group; gloo's sockets on ``local`` (this host's address as the peers reach it)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    gloo = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # the devices option is private
    gloo._timeout = timeout
    gloo._devices = [_gloo_device(local)]
    return dist.ProcessGroupGloo(store, rank, world_size, gloo)


def _gloo_device(local: str) -> Any:
    """Gloo's device: bound to ``local``, or to the interface ``GLOO_SOCKET_IFNAME`` names when it is set. (Gloo's
    default device binds the address this host's name resolves to, often 127.0.0.1: peers elsewhere cannot reach
    it, and a group across machines never forms.)"""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return dist.ProcessGroupGloo.create_default_device()
    return dist.ProcessGroupGloo.create_device(hostname=local)


_FROM_RANK_0 = dist.BroadcastOptions()  # rootRank and rootTensor default to 0


def _device(backend: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


class _Group:
    def __init__(
        self,
        group: Any,
        rank: int,
        backend: str,
        address: str,
        store: dist.Store | None = None,
    ) -> None:
        self._group = group
        self._store = store  # the leader's rendezvous lives as long as the group
        self.rank = rank
        self.device = _device(backend)
        self.address = address

    def vote(self, agree: bool) -> bool:
        """All ranks agree (an all-reduce MIN of 1 for yes)."""
        flag = torch.tensor([1 if agree else 0], dtype=torch.int32, device=self.device)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MIN
        self._run(lambda: self._group.allreduce([flag], options))
        return bool(flag.item())

    def _commit(self) -> None:
        """The all-reduce after the last piece: it completes on no rank before every rank has every byte."""
        if not self.vote(True):  # every rank says yes: a no here is a peer of another protocol
            raise WeightGroupError(f"a rank of the weight group at {self.address} did not commit the update")

    def _broadcast(self, piece: torch.Tensor) -> None:
        self._run(lambda: self._group.broadcast([piece], _FROM_RANK_0))

    def _run(self, collective: Callable[[], Any]) -> None:
        try:
            collective().wait()
        except RuntimeError as error:  # a rank left, or the timeout passed
            raise WeightGroupError(f"a collective of the weight group at {self.address} failed: {error}") from error

    def close(self) -> None:
        """Leave the group (idempotent). Returns at once: a collective still waiting on another thread ends with an
        error at the group's timeout (gloo cannot interrupt it), and the peers see this rank gone."""
        group, self._group = self._group, None
        if group is not None:
            with contextlib.suppress(RuntimeError):  # a peer already gone: nothing left to release with it
                group.abort()


class WeightGroupMember(_Group):
    """An engine worker's place in a group (blocking calls: run them off the event loop)."""

    @classmethod
    def join(cls, spec: WeightGroupSpec, rank: int) -> WeightGroupMember:
        address = f"{spec.master_address}:{spec.master_port}"
        try:
            local = local_address_towards(address)
            store = dist.TCPStore(
                spec.master_address, spec.master_port, spec.world_size, is_master=False,
                timeout=datetime.timedelta(seconds=spec.timeout_s),
            )
            group = _process_group(dist.PrefixStore(f"{spec.name}/", store), rank, spec.world_size, spec.backend,
                                   spec.timeout_s, local)
        except (OSError, RuntimeError, ValueError) as error:  # DistStoreError/DistNetworkError are RuntimeErrors
            raise WeightGroupError(f"could not join weight group {spec.name!r} at {address}: {error}") from error
        return cls(group, rank, spec.backend, address)

    def vote_and_receive(self, layout: BucketLayout, agree: bool) -> torch.Tensor | None:
        """Vote on the update of ``layout``; its bytes if every rank agreed, else None (nothing is sent)."""
        return self.receive(layout) if self.vote(agree) else None

    def receive(self, layout: BucketLayout) -> torch.Tensor:
        """The broadcast bytes of ``layout``, in one flat uint8 tensor on this member's device, once every rank has
        them all (the commit; WeightGroupError if a rank is lost before: then nobody applies them)."""
        flat = torch.empty(layout.total_bytes, dtype=torch.uint8, device=self.device)
        for start, end in layout.pieces():
            self._broadcast(flat[start:end])
        self._commit()
        return flat


class WeightGroupLeader(_Group):
    """The trainer's rank 0: hosts the rendezvous, then sends (blocking calls: run them off the event loop)."""

    @classmethod
    def host(cls, address: str, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S,
             port: int = 0) -> tuple[dist.TCPStore, int]:
        """Start the rendezvous on ``address`` (port 0: a free one); return the store and its port."""
        try:  # an address that is not this machine's fails here at once (the store would wait out its timeout)
            with socket.create_server((address, 0)):
                pass
        except OSError as error:
            raise WeightGroupError(f"could not host a weight group at {address}: {error}") from error
        try:
            store = dist.TCPStore(address, port, world_size, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as error:  # DistNetworkError: the address is not this machine's, the port is taken
            raise WeightGroupError(f"could not host a weight group at {address}:{port}: {error}") from error
        return store, store.port

    @classmethod
    def form(cls, store: dist.TCPStore, spec: WeightGroupSpec) -> WeightGroupLeader:
        """Join as rank 0; returns once every rank joined (WeightGroupError after ``spec.timeout_s``)."""
        address = f"{spec.master_address}:{spec.master_port}"
        try:
            group = _process_group(dist.PrefixStore(f"{spec.name}/", store), 0, spec.world_size, spec.backend,
                                   spec.timeout_s, spec.master_address)
        except RuntimeError as error:
            raise WeightGroupError(f"weight group {spec.name!r} at {address} did not form: {error}") from error
        return cls(group, 0, spec.backend, address, store)

    def send(self, layout: BucketLayout, sources: Sequence[object]) -> None:
        """Broadcast ``sources`` (bytes-like or tensors on any device, one per spec of ``layout``) piece by piece;
        only one piece at a time is copied to the group's device."""
        views = [_bytes_of(source) for source in sources]
        piece = torch.zeros(min(layout.bucket_bytes, layout.total_bytes), dtype=torch.uint8, device=self.device)
        for start, end in layout.pieces():
            for view, offset in zip(views, layout.offsets):
                lo, hi = max(start, offset), min(end, offset + view.numel())
                if lo < hi:
                    piece[lo - start : hi - start].copy_(view[lo - offset : hi - offset])
            self._broadcast(piece[: end - start])
        self._commit()


def _bytes_of(source: object) -> torch.Tensor:
    """``source``'s bytes as a flat uint8 tensor where it lies (no copy for a contiguous tensor or bytes)."""
    if isinstance(source, torch.Tensor):
        return source.detach().contiguous().reshape(-1).view(torch.uint8)
    data = memoryview(source).cast("B")  # type: ignore[arg-type]
    if not len(data):
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():  # read-only bytes: they are only read from
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(data, dtype=torch.uint8)
