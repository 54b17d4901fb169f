"""How new weights reach the engines: streamed over gRPC to each, or written once as a checkpoint they load.

``stream`` (UpdateWeights) works anywhere, but sends the bytes once per engine through gRPC. ``path``
(LoadWeights) writes one safetensors file to a folder every engine can read and sends each engine only its name:
the choice when the engines share a file system with the trainer (``auto`` takes it when every engine is on this
machine). The choice is logged once, when made.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from agentloop_grpc.common.addresses import is_loopback
from agentloop_grpc.common.safetensors_format import write_safetensors
from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.router import FanOutResult, Fleet

log = logging.getLogger(__name__)

WeightTransferKind = Literal["auto", "stream", "path"]


class WeightTransfer(Protocol):
    name: str

    async def push(self, fleet: Fleet, tensors: Sequence[NamedTensor], weight_version: int) -> FanOutResult:
        """Apply ``tensors`` as ``weight_version`` on every server of ``fleet``."""
        ...


@dataclass(frozen=True)
class StreamTransfer:
    name: str = "stream"

    async def push(self, fleet: Fleet, tensors: Sequence[NamedTensor], weight_version: int) -> FanOutResult:
        return await fleet.update_weights(tensors, weight_version)


@dataclass(frozen=True)
class PathTransfer:
    """Writes each update to ``folder`` (read by every engine), has the engines load it, then removes it."""

    folder: Path
    name: str = "path"

    async def push(self, fleet: Fleet, tensors: Sequence[NamedTensor], weight_version: int) -> FanOutResult:
        file = self.folder / f"weights-v{weight_version}.safetensors"
        await asyncio.to_thread(write_safetensors, file, tensors)
        try:
            return await fleet.load_weights(str(file), weight_version)
        finally:
            file.unlink(missing_ok=True)


def choose_weight_transfer(
    kind: WeightTransferKind, addresses: Iterable[str], folder: str | None = None
) -> WeightTransfer:
    """The transfer ``kind`` names; ``auto``: ``path`` when every engine is on this machine (or ``folder`` is
    given: the caller says the engines can read it), else ``stream``."""
    addresses = list(addresses)
    if kind == "auto":
        kind = "path" if folder or (addresses and all(is_loopback(a) for a in addresses)) else "stream"
    if kind == "stream":
        log.info("weight updates go to %d engines by stream (UpdateWeights)", len(addresses))
        return StreamTransfer()
    where = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="agentloop-weights-"))
    where.mkdir(parents=True, exist_ok=True)
    log.info("weight updates go to %d engines by path (LoadWeights from %s)", len(addresses), where)
    return PathTransfer(where)
