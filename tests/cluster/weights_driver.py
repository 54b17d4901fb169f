"""The trainer side of the weight tests, run in the head's namespace: ``python -m tests.cluster.weights_driver MODE
DISCOVERY WEIGHTS_DIR TIMEOUT_S``. It pushes as TRL's ``AgentLoopRollout.push_weights`` does
(``AgentLoopManager.update_weights(..., leave_out_unreachable=True)``) and prints one JSON line per step.

``push``: an update by collective (gloo, the group's rendezvous on this node's address), then one by path (a
checkpoint in WEIGHTS_DIR, which every node reads); after each, every server's version and a generation on each.

``fault`` (talks with the test on stdin/stdout):
  1. an update forms a group of both servers; prints ``formed``;
  2. the next update stops after the first of its pieces is sent, prints ``midway`` and reads ``cut <unix time>``
     (the test took a member's link down), goes on, and prints ``failed`` with the error and how long each
     member's answer took from the cut;
  3. the update after it, with the member still cut off: prints ``excluded`` (left out, the group, versions);
  4. reads ``healed``, waits until the member answers, updates both: prints ``rejoined``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

from agentloop_grpc.agent import AgentLoopManager, WorkerSpec
from agentloop_grpc.common import weight_group
from agentloop_grpc.common.types import NamedTensor, SamplingParams
from agentloop_grpc.router import GenerateCall, Router, RouterConfig
from agentloop_grpc.router.discovery import discovery_addresses, discovery_config

#: The fault's update is cut into pieces of this size (the smallest a transfer takes), so it has a middle.
PIECE = 1 << 20


_STARTED = time.monotonic()


def _say(word: str, payload: dict) -> None:
    print(word, json.dumps({**payload, "at_s": time.monotonic() - _STARTED}), flush=True)


def _tensors(seed: int, pieces: int = 1) -> list[NamedTensor]:
    data = bytes((seed + i) % 251 for i in range(PIECE * pieces - 64))
    return [NamedTensor("model.layers.0.mlp.weight", "uint8", (len(data),), data),
            NamedTensor("model.norm.weight", "float32", (4,), bytes(16))]


class _Formed(logging.Handler):
    """The group's rendezvous addresses, as the transfer logs them when a group forms."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if " formed at " in message:
            self.at.append(message.split(" formed at ")[1].split(":")[0])


async def _versions(manager: AgentLoopManager) -> dict[str, int]:
    infos = await manager.control.server_info()
    return {a: int(i.weight_version) for a, i in infos.responses.items()}


async def _generated_versions(discovery: str) -> dict[str, list[int]]:
    """The weight versions of a generation's tokens on each server."""
    found = {}
    for address in discovery_addresses(discovery):
        async with Router([address], discovery_config(discovery, RouterConfig())) as router:
            result = await router.generate(GenerateCall("after-update", [5, 6, 7], SamplingParams(max_new_tokens=4)))
        found[address] = sorted(set(result.weight_versions))
    return found


def _spec(discovery: str, kind: str, weights_dir: str | None, timeout_s: float) -> WorkerSpec:
    return WorkerSpec(discovery_file=discovery, weight_transfer=kind, weights_dir=weights_dir,
                      weight_group_timeout_s=timeout_s)


async def push(discovery: str, weights_dir: str, timeout_s: float) -> None:
    formed = _Formed()
    logging.getLogger("agentloop_grpc.agent.weight_transfer").addHandler(formed)
    logging.getLogger("agentloop_grpc.agent.weight_transfer").setLevel(logging.INFO)
    for kind, folder in (("collective", None), ("path", weights_dir)):
        async with AgentLoopManager(_spec(discovery, kind, folder, timeout_s)) as manager:
            await manager.control.wait_ready(min_servers=2, timeout_s=30)
            version = max((await _versions(manager)).values()) + 1
            began = time.monotonic()
            left_out = await manager.update_weights(_tensors(version), version, leave_out_unreachable=True)
            seconds = time.monotonic() - began
            _say(kind, {"transfer": manager.weight_transfer, "version": version, "left_out": sorted(left_out),
                        "seconds": seconds, "versions": await _versions(manager), "group_at": formed.at,
                        "generated": await _generated_versions(discovery)})


async def fault(discovery: str, timeout_s: float) -> None:
    # a first update with a generous timeout: the fake servers import torch at their first join, which on a loaded
    # machine may take longer than the short timeout of the group below (the other engines have torch already)
    async with AgentLoopManager(_spec(discovery, "collective", None, 60)) as manager:
        await manager.control.wait_ready(min_servers=2, timeout_s=30)
        version = max((await _versions(manager)).values()) + 1
        await manager.update_weights(_tensors(version), version, leave_out_unreachable=True)
    _say("warm", {"version": version})
    async with AgentLoopManager(_spec(discovery, "collective", None, timeout_s)) as manager:
        await manager.control.wait_ready(min_servers=2, timeout_s=30)
        first = max((await _versions(manager)).values()) + 1
        await manager.update_weights(_tensors(first), first, leave_out_unreachable=True)
        transfer = manager._weights  # the CollectiveTransfer the first update chose
        group = transfer.group
        _say("formed", {"version": first, "group": group, "members": sorted(transfer.members),
                        "versions": await _versions(manager)})

        # 2. cut a member off once the first piece of the next update is sent
        transfer.bucket_bytes = PIECE
        sent, cut_at, answered = 0, [0.0], {}
        broadcast, receive = weight_group.WeightGroupLeader._broadcast, manager.control.receive_weights

        def broadcast_and_stop(self, piece) -> None:
            nonlocal sent
            broadcast(self, piece)
            sent += 1
            if sent == 1:
                _say("midway", {"pieces_sent": sent})
                word, at = sys.stdin.readline().split()
                assert word == "cut", word
                cut_at[0] = float(at)

        async def timed_receive(*args, servers, **kwargs):
            try:
                return await receive(*args, servers=servers, **kwargs)  # type: ignore[misc]  # args never holds it
            finally:
                answered[next(iter(servers))] = time.time()

        weight_group.WeightGroupLeader._broadcast = broadcast_and_stop
        manager.control.receive_weights = timed_receive
        try:
            await manager.update_weights(_tensors(first + 1, pieces=3), first + 1, leave_out_unreachable=True)
            error = None
        except Exception as failure:  # noqa: BLE001 - the driver reports whatever the trainer would see
            error = f"{type(failure).__name__}: {failure}"
        failed_s = time.time() - cut_at[0]
        weight_group.WeightGroupLeader._broadcast = broadcast
        manager.control.receive_weights = receive
        _say("failed", {"error": error, "failed_s": failed_s, "group": transfer.group,
                        "answered_s": {a: t - cut_at[0] for a, t in answered.items()},
                        "versions": await _versions(manager)})

        # 3. the next update, the member still cut off
        began = time.time()
        left_out = await manager.update_weights(_tensors(first + 2), first + 2, leave_out_unreachable=True)
        _say("excluded", {"left_out": sorted(left_out), "group": transfer.group, "members": sorted(transfer.members),
                          "seconds": time.time() - began, "versions": await _versions(manager)})

        # 4. healed: both again
        word, at = sys.stdin.readline().split()
        assert word == "healed", word
        while len(versions := await _versions(manager)) < 2:
            await asyncio.sleep(0.2)
        back = time.time() - float(at)
        await manager.update_weights(_tensors(first + 3), first + 3, leave_out_unreachable=True)
        _say("rejoined", {"answered_after_s": back, "versions_back": versions, "group": transfer.group,
                          "members": sorted(transfer.members), "versions": await _versions(manager),
                          "generated": await _generated_versions(discovery)})


if __name__ == "__main__":
    mode, discovery, folder, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    asyncio.run(push(discovery, folder, timeout) if mode == "push" else fault(discovery, timeout))
