"""verl's weights, as its trainer workers yield them (``(name, tensor)`` pairs, sync or async, on any device),
applied on our engine servers by our weight transfer (``agent/weight_transfer.py``), chosen at the first push.

Every trainer rank must walk verl's generator (an FSDP engine gathers each full tensor collectively), so ranks
that do not push ``drain`` it. The pushing rank keeps its Fleet and transfer across updates: a weight group
formed once is reused until the servers change.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from verl.workers.rollout.utils import ensure_async_iterator

from agentloop_grpc.agent.weight_transfer import WeightTransfer, choose_weight_transfer
from agentloop_grpc.integrations.named_tensors import named_tensor
from agentloop_grpc.router import Fleet

from .settings import AgentloopSettings


async def drain(weights: Any) -> int:
    """Walk verl's generator without keeping anything (a rank that does not push); the number of tensors."""
    count = 0
    async for _name, _tensor in ensure_async_iterator(weights):
        count += 1
    return count


class WeightPusher:
    """Pushes verl's weights to engine servers; see the module docstring."""

    def __init__(self, settings: AgentloopSettings) -> None:
        self.settings = settings
        self._fleet: Fleet | None = None
        self._transfer: WeightTransfer | None = None
        self._version = 0

    @property
    def transfer(self) -> str | None:
        """The transfer chosen at the first push."""
        return self._transfer.name if self._transfer else None

    async def push(self, servers: Sequence[str], weights: Any, global_steps: int | None) -> dict[str, Any]:
        """Apply ``weights`` on every server of ``servers`` as weight version ``global_steps`` (None: one more
        than the last); verl's sync metrics for the trainer's log. InfrastructureError names a server that did not
        apply them."""
        started = time.perf_counter()
        tensors = [named_tensor(name, tensor) async for name, tensor in ensure_async_iterator(weights)]
        gathered = time.perf_counter()
        fleet = await self._fleet_of(servers)
        if self._transfer is None:
            self._transfer = await choose_weight_transfer(
                self.settings.weight_transfer, fleet, self.settings.weights_dir, self.settings.weight_group_address,
                self.settings.weight_group_backend,
            )
        self._version = self._version + 1 if global_steps is None else int(global_steps)
        (await self._transfer.push(fleet, tensors, self._version)).raise_for_errors()
        done = time.perf_counter()
        return {"agentloop/weight_gather_s": gathered - started, "agentloop/weight_transfer_s": done - gathered,
                "agentloop/weight_bytes": sum(len(t.data) for t in tensors)}

    async def _fleet_of(self, servers: Sequence[str]) -> Fleet:
        if self._fleet is not None and set(self._fleet.servers) != set(servers):
            await self.close()  # other servers: a group formed with the old ones is no use
        if self._fleet is None:
            self._fleet = await Fleet(list(servers)).__aenter__()
        return self._fleet

    async def close(self) -> None:
        fleet, transfer, self._fleet, self._transfer = self._fleet, self._transfer, None, None
        if fleet is not None:
            if transfer is not None:
                await transfer.close(fleet)
            await fleet.close()
