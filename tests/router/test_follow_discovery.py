"""A Router following a launcher's discovery file (router/follow.py): a server the file gains joins the fleet, held
out while it serves older weights than the fleet's; one the file drops leaves once it stops answering; servers the
Router has from elsewhere stay."""

from __future__ import annotations

import asyncio
import json

from agentloop_grpc.agent.spec import WorkerSpec
from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.router import GenerateCall, Router
from agentloop_grpc.router.follow import following_discovery_file

from .conftest import address, fake_servers
from .test_routing import FAST, _until, params

TENSOR = NamedTensor("w", "float32", (1,), b"\0\0\0\0")


def _write(path, addresses: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"servers": [{"address": a} for a in addresses]}))
    tmp.replace(path)


async def test_a_router_follows_the_servers_its_discovery_file_gains_and_drops(tmp_path) -> None:
    discovery = tmp_path / "discovery.json"
    async with fake_servers(3) as servers:
        listed, restarted, elsewhere = (address(s) for s in servers)
        _write(discovery, [listed])
        await servers[0].lifecycle.update_weights([TENSOR], 2, flush_cache=False)
        async with Router([listed, elsewhere], FAST) as router, \
                following_discovery_file(router.fleet, discovery, interval_s=0.05):
            await router.fleet.wait_ready(2)
            await servers[2].lifecycle.update_weights([TENSOR], 2, flush_cache=False)
            await router.fleet.server_info()
            assert router.fleet.weight_version == 2 and not router.fleet.held_out
            # the launcher restarted a server at a new address: it joins, held out at its initial weights
            _write(discovery, [restarted, listed])
            await _until(lambda: restarted in router.fleet.servers and router.fleet.servers[restarted].healthy)
            await _until(lambda: router.fleet.held_out == {restarted})
            for i in range(8):
                result = await router.generate(GenerateCall(f"s{i}", [1, 2, 3], params(2)))
                assert result.servers[0] != restarted
            await servers[1].lifecycle.update_weights([TENSOR], 2, flush_cache=False)
            await _until(lambda: not router.fleet.held_out)
            # dropped from the file while it serves: kept until it stops answering, then removed
            _write(discovery, [restarted])
            await asyncio.sleep(0.3)  # six polls
            assert listed in router.fleet.servers
            await servers[0].stop(grace_s=0)
            await _until(lambda: listed not in router.fleet.servers)
            assert set(router.fleet.servers) == {restarted, elsewhere}  # not from the file: left alone


async def test_a_router_or_spec_built_from_a_discovery_file_follows_it_unless_told_to_read_it_once(tmp_path) -> None:
    discovery = tmp_path / "discovery.json"
    async with fake_servers(2) as servers:
        first, restarted = (address(s) for s in servers)
        _write(discovery, [first])
        following = FAST.model_copy(update={"discovery_poll_s": 0.05})
        once = FAST.model_copy(update={"discovery_poll_s": 0})
        spec = WorkerSpec(discovery_file=str(discovery), router=following)
        async with spec.make_router() as router, Router.from_discovery_file(discovery, once) as reads_once:
            await router.fleet.wait_ready(1)
            _write(discovery, [first, restarted])
            await _until(lambda: restarted in router.fleet.servers and router.fleet.servers[restarted].healthy)
            result = await router.generate(GenerateCall("s", [1, 2, 3], params(2)))
            assert result.servers[0] in {first, restarted}
            assert set(reads_once.fleet.servers) == {first}
        # the follower stops with the router
        assert not [t for t in asyncio.all_tasks() if "follow_discovery_file" in repr(t.get_coro())]
