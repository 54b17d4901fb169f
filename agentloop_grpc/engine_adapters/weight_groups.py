"""The weight-transfer groups of an engine whose one worker is the server process (embedded, fake).

Joining, voting and receiving block on the group's sockets, so they run on threads: the event loop (and, for the
embedded engine, its step thread) keeps generating while the bytes arrive. Engines with workers elsewhere (vLLM's
engine process) do the same in their workers with the same ``WeightGroupMember``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from agentloop_grpc.common.errors import EngineError, EngineUnavailableError, FailedPreconditionError
from agentloop_grpc.common.weight_layout import BucketLayout, WeightGroupError, WeightGroupSpec

if TYPE_CHECKING:
    import torch

    from agentloop_grpc.common.weight_group import WeightGroupMember


def refused_elsewhere(group: str) -> FailedPreconditionError:
    """The error of a member that agreed to an update another member refused."""
    return FailedPreconditionError(
        f"another member of weight group {group!r} refused this update (its server answered why); nothing was applied"
    )


class LocalWeightGroups:
    """Groups joined by this process, by name."""

    def __init__(self) -> None:
        self._members: dict[str, WeightGroupMember] = {}

    async def join(self, spec: WeightGroupSpec) -> list[int]:
        from agentloop_grpc.common.weight_group import WeightGroupMember  # torch: imported by the first join

        try:
            self._members[spec.name] = await asyncio.to_thread(WeightGroupMember.join, spec, spec.rank_offset)
        except WeightGroupError as error:
            raise EngineUnavailableError(str(error)) from error
        return [spec.rank_offset]

    async def receive(self, group: str, layout: BucketLayout, refusal: EngineError | None) -> torch.Tensor:
        """Vote, then receive; raise ``refusal`` (after voting no) or the refusal of another member."""
        member = self._members[group]
        try:
            flat = await asyncio.to_thread(member.vote_and_receive, layout, refusal is None)
        except WeightGroupError as error:
            raise EngineUnavailableError(f"{error}; join the group again") from error
        if refusal is not None:
            raise refusal
        if flat is None:
            raise refused_elsewhere(group)
        return flat

    async def leave(self, group: str) -> None:
        member = self._members.pop(group, None)
        if member is not None:
            await asyncio.to_thread(member.close)
