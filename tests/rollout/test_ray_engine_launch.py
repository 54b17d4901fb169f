"""`RayEngineLauncher`: one server per DP group, each in its own placement group on a real (local) Ray; a Router
uses them from the discovery file; stopping removes servers and placement groups; a killed host takes its server
with it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import ray
from ray.util import placement_group_table

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.launch.launcher import EngineLaunch
from agentloop_grpc.launch.ray_launcher import RayEngineLauncher, RayResources
from agentloop_grpc.router import GenerateCall, Router

from ..ray_start import init_ray
from .launching import sigterm_while_loading


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    started = init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def _closed(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) != 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_one_placement_group_per_dp_group_serving_a_router(local_ray, tmp_path) -> None:
    launch = EngineLaunch(engine=FakeEngineConfig(), dp=2, extra_args=("--log-level", "WARNING"), startup_timeout_s=60)
    launcher = RayEngineLauncher(launch, tmp_path / "logs", RayResources(cpus_per_server=0.5, ready_timeout_s=60))
    async with launcher:
        discovery = launcher.write_discovery(tmp_path / "discovery.json")
        servers = json.loads(discovery.read_text())["servers"]
        assert [s["dp_rank"] for s in servers] == [0, 1]
        assert all(s["address"].startswith(s["node_ip"] + ":") for s in servers)  # bound to the node's address
        groups = [placement_group_table(g) for g in launcher.placement_groups]
        assert [g["state"] for g in groups] == ["CREATED", "CREATED"]
        assert [g["bundles"] for g in groups] == [{0: {"CPU": 0.5}}, {0: {"CPU": 0.5}}]
        assert sorted(s["placement_group"] for s in servers) == sorted(g["placement_group_id"] for g in groups)
        async with Router.from_discovery_file(discovery) as router:
            await router.fleet.wait_ready(min_servers=2, timeout_s=30)
            info = await router.fleet.server_info()
            assert sorted(r.dp_rank for r in info.responses.values()) == [0, 1]
            used: set[str] = set()
            for i in range(64):  # equal loads: a hash of the session breaks the tie, so both get used
                result = await router.generate(GenerateCall(f"s{i}", [1, 2, 3], SamplingParams(max_new_tokens=2)))
                used.update(result.servers)
                if len(used) == 2:
                    break
            assert used == {s["address"] for s in servers}
        group_ids = [g["placement_group_id"] for g in groups]
    assert all(_closed(s["address"]) for s in servers)
    assert [placement_group_table().get(i, {}).get("state") for i in group_ids] == ["REMOVED", "REMOVED"]


async def test_a_killed_host_actor_takes_its_server_with_it(local_ray, tmp_path) -> None:
    launch = EngineLaunch(engine=FakeEngineConfig(), dp=1, extra_args=("--log-level", "WARNING"), startup_timeout_s=60)
    async with RayEngineLauncher(launch, tmp_path / "logs", RayResources(cpus_per_server=0.5)) as launcher:
        pid = await launcher.hosts[0].server_pid.remote()
        assert pid is not None and _alive(pid)
        ray.kill(launcher.hosts[0])
        async with asyncio.timeout(30):
            while _alive(pid):
                await asyncio.sleep(0.1)
        assert _closed(launcher.addresses[0])


async def test_no_room_in_the_cluster_is_a_clear_error(local_ray, tmp_path) -> None:
    from agentloop_grpc.launch.launcher import LaunchError

    launch = EngineLaunch(engine=FakeEngineConfig(), dp=1)
    launcher = RayEngineLauncher(launch, tmp_path, RayResources(cpus_per_server=64, ready_timeout_s=1))
    with pytest.raises(LaunchError, match="no room for 1 placement groups"):
        await launcher.start()
    assert launcher.placement_groups == [] and launcher.hosts == []


def test_cli_launch_with_ray_joins_the_cluster_and_stops_on_sigterm(local_ray, tmp_path) -> None:
    discovery = tmp_path / "discovery.json"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "agentloop_grpc.cli", "engine", "launch", "--adapter", "fake", "--dp", "2", "--ray",
         "--ray-address", ray.get_runtime_context().gcs_address, "--cpus-per-server", "0.5",
         "--discovery-file", str(discovery), "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = launcher.stdout.readline()
        assert "2 fake server(s) serving over Ray placement groups" in line, (
            line, launcher.stderr.read() if launcher.poll() is not None else ""
        )
        servers = json.loads(discovery.read_text())["servers"]
        assert len({s["placement_group"] for s in servers}) == 2
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
    assert launcher.returncode == 0
    assert all(_closed(s["address"]) for s in servers)


@pytest.mark.slow
def test_cli_sigterm_while_servers_load_removes_the_placement_groups(local_ray, tmp_path) -> None:
    """Stopped before its server serves, the launcher exits 0 and removes its group (Ray's own SIGTERM handler,
    installed by ray.init, would have exited 15 and left them to Ray's job cleanup)."""
    earlier = _live_groups()  # the session's Ray is shared: groups of earlier suites are not this launcher's
    code, out, err, _ = sigterm_while_loading(
        [sys.executable, "-m", "agentloop_grpc.cli", "engine", "launch", "--adapter", "embedded", "--dp", "1",
         "--ray", "--ray-address", ray.get_runtime_context().gcs_address, "--cpus-per-server", "0.5",
         "--discovery-file", str(tmp_path / "discovery.json"), "--log-dir", str(tmp_path / "logs")],
        tmp_path / "logs",
    )
    assert code == 0, err
    assert "serving" not in out
    assert _live_groups() - earlier == set()


def _live_groups() -> set[str]:
    return {group_id for group_id, group in placement_group_table().items() if group["state"] != "REMOVED"}


def test_host_with_ray_is_refused_rather_than_ignored() -> None:
    """Over Ray each server binds its node's Ray address (what the discovery file records); a --host would not."""
    result = subprocess.run(
        [sys.executable, "-m", "agentloop_grpc.cli", "engine", "launch", "--adapter", "fake", "--ray",
         "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"},
    )
    assert result.returncode == 2 and "--host does not apply with --ray" in result.stderr


async def test_a_lost_server_is_reported_restarted_and_a_following_router_takes_it_up(local_ray, tmp_path) -> None:
    """The server process killed (as an OOM kill would): the launcher reports the loss, drops it from the discovery
    file, starts it again in the same placement group and writes its new address, which a Router following the
    file adds and routes to; the server it replaces is removed from the Router once gone from the file."""
    from agentloop_grpc.router.follow import following_discovery_file

    launch = EngineLaunch(engine=FakeEngineConfig(), dp=1, extra_args=("--log-level", "WARNING"), startup_timeout_s=60)
    discovery = tmp_path / "discovery.json"
    async with RayEngineLauncher(launch, tmp_path / "logs", RayResources(cpus_per_server=0.5),
                                 restart_lost=True) as launcher:
        launcher.write_discovery(discovery)
        before = json.loads(discovery.read_text())["servers"][0]
        async with Router.from_discovery_file(discovery) as router, \
                following_discovery_file(router.fleet, discovery, interval_s=0.1):
            launcher.watch(discovery)
            os.kill(await launcher.hosts[0].server_pid.remote(), signal.SIGKILL)
            async with asyncio.timeout(60):
                while not any(kind == "restarted" for kind, _, _ in launcher.events):
                    await asyncio.sleep(0.1)
            after = json.loads(discovery.read_text())["servers"][0]
            assert after["address"] != before["address"] and after["dp_rank"] == 0
            assert after["placement_group"] == before["placement_group"]  # the same reservation, same node
            assert [kind for kind, _, _ in launcher.events] == ["lost", "restarted"]
            assert f"engine server {before['address']} (dp rank 0) on node {before['node_ip']}" in launcher.events[0][2]
            assert "its server process exited with code -9" in launcher.events[0][2]
            async with asyncio.timeout(30):
                while set(router.fleet.servers) != {after["address"]}:
                    await asyncio.sleep(0.1)
                await router.fleet.wait_ready(min_servers=1, timeout_s=30)
            result = await router.generate(GenerateCall("after", [1, 2, 3], SamplingParams(max_new_tokens=2)))
            assert result.servers == (after["address"],)


async def test_without_restart_a_dead_host_is_reported_and_its_group_removed(local_ray, tmp_path) -> None:
    launch = EngineLaunch(engine=FakeEngineConfig(), dp=2, extra_args=("--log-level", "WARNING"), startup_timeout_s=60)
    discovery = tmp_path / "discovery.json"
    async with RayEngineLauncher(launch, tmp_path / "logs", RayResources(cpus_per_server=0.5)) as launcher:
        launcher.write_discovery(discovery)
        launcher.watch(discovery)
        lost = launcher.servers[1]
        ray.kill(launcher.hosts[1])
        async with asyncio.timeout(30):
            while len(launcher.events) < 2:
                await asyncio.sleep(0.1)
        assert [(kind, rank) for kind, rank, _ in launcher.events] == [("lost", 1), ("not restarted", 1)]
        assert f"engine server {lost['address']} (dp rank 1) on node" in launcher.events[0][2]
        assert [s["dp_rank"] for s in json.loads(discovery.read_text())["servers"]] == [0]
        async with asyncio.timeout(30):
            while placement_group_table(launcher.placement_groups[1])["state"] != "REMOVED":
                await asyncio.sleep(0.1)
        assert placement_group_table(launcher.placement_groups[0])["state"] == "CREATED"
    assert launcher.events[2:] == []  # stopping is no loss


def test_resources_per_server_go_into_each_bundle() -> None:
    assert RayResources(cpus_per_server=2, resources={"engine_node": 1}).bundle == {"CPU": 2, "engine_node": 1}
    with pytest.raises(ValueError, match="custom resources"):
        RayResources(resources={"GPU": 1})
