"""`agentloop engine launch`: one server per DP group on this node, health awaited, a discovery file the Router
reads; stopping the launcher stops its servers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from typer.testing import CliRunner

from agentloop_grpc.cli.commands import app
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.config import engine_config
from agentloop_grpc.launch.launcher import EngineLaunch, EngineLauncher
from agentloop_grpc.router import GenerateCall, Router

from .launching import discovered, sigterm_while_loading

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]


def _closed(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) != 0


@pytest.mark.slow
@pytest.mark.parametrize("adapter", ["fake", "embedded"])
async def test_launch_dp2_serves_two_replicas_a_router_uses(tmp_path, adapter):
    discovery = tmp_path / "discovery.json"
    launcher = subprocess.Popen(
        [*AGENTLOOP, "engine", "launch", "--adapter", adapter, "--dp", "2", "--discovery-file", str(discovery),
         "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = launcher.stdout.readline()
        assert "2 " + adapter + " server(s) serving" in line, (line, launcher.stderr.read() if launcher.poll() else "")
        servers = json.loads(discovery.read_text())["servers"]
        assert [s["dp_rank"] for s in servers] == [0, 1] and len({s["address"] for s in servers}) == 2
        async with Router.from_discovery_file(discovery) as router:
            await router.fleet.wait_ready(min_servers=2, timeout_s=30)
            info = await router.fleet.server_info()
            assert sorted(r.dp_rank for r in info.responses.values()) == [0, 1]
            assert {r.dp_size for r in info.responses.values()} == {2}
            used: set[str] = set()
            # sequential calls see equal loads: a hash of the session breaks the tie, so 64 new sessions miss a
            # server with probability 2**-63 (8 missed one in 128 runs)
            for i in range(64):
                result = await router.generate(GenerateCall(f"s{i}", [1, 2, 3, 4], SamplingParams(max_new_tokens=2)))
                used.update(result.servers)
                if len(used) == 2:
                    break
            assert used == {s["address"] for s in servers}
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
    assert launcher.returncode == 0
    assert all(_closed(s["address"]) for s in servers)


def test_tensor_parallel_needs_a_real_adapter(tmp_path):
    result = CliRunner().invoke(app, ["engine", "launch", "--adapter", "embedded", "--set", "tp_size=2"],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "tp_size: Extra inputs are not permitted" in result.output


_STARTER = """
import asyncio, sys
from pathlib import Path
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.launch.launcher import EngineLaunch, ServerProcess

async def main():
    command = EngineLaunch(engine=FakeEngineConfig(), extra_args=("--log-level", "WARNING")).command(0)
    server = ServerProcess(command, Path(sys.argv[1]), terminate_with_parent=True)
    await server.start(60)
    print(server.process.pid, server.address, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_a_server_started_with_terminate_with_parent_dies_with_its_starter(tmp_path):
    """What keeps a Ray host actor's server from outliving it (the server runs in its own session)."""
    starter = subprocess.Popen([sys.executable, "-c", _STARTER, str(tmp_path / "server.log")],
                               stdout=subprocess.PIPE, text=True)
    pid, address = starter.stdout.readline().split()
    starter.kill()
    starter.wait()
    for _ in range(300):
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(int(pid), signal.SIGKILL)
        raise AssertionError("the server outlived its starter")
    assert _closed(address)


@pytest.mark.slow
def test_sigterm_while_servers_load_stops_them_cleanly(tmp_path):
    """A launcher stopped before its servers serve (the embedded model takes seconds to load) exits 0 and takes
    its servers with it, rather than dying of the signal and orphaning them."""
    discovery = tmp_path / "discovery.json"
    code, out, err, children = sigterm_while_loading(
        [*AGENTLOOP, "engine", "launch", "--adapter", "embedded", "--dp", "1", "--log-dir", str(tmp_path / "logs"),
         "--discovery-file", str(discovery)],
        tmp_path / "logs",
    )
    assert code == 0, err
    assert "serving" not in out and not discovery.exists()
    assert len(children) == 1 and not psutil.pid_exists(children[0])


def test_the_advertised_host_is_dialable_for_an_unspecified_bind_address(monkeypatch):
    from agentloop_grpc.launch import launcher

    monkeypatch.setattr(launcher, "host_address", lambda: "10.1.2.3")
    assert launcher.advertised_host("127.0.0.1") == "127.0.0.1"
    assert launcher.advertised_host("0.0.0.0") == "10.1.2.3" and launcher.advertised_host("::") == "10.1.2.3"
    assert launcher.advertised_host("0.0.0.0", "engines.example") == "engines.example"
    assert launcher.advertised_host("::", "fd00::5") == "[fd00::5]"


def test_this_hosts_address_is_not_loopback_or_unspecified():
    from agentloop_grpc.launch.launcher import host_address, interface_addresses

    address = host_address()
    socket.inet_aton(address)  # IPv4
    assert address != "0.0.0.0"
    assert not address.startswith("127.") or interface_addresses() == []


async def test_a_launch_bound_to_all_interfaces_records_an_address_clients_can_dial(tmp_path):
    """Before: the discovery file said 0.0.0.0:PORT, which no other machine can dial."""
    from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
    from agentloop_grpc.launch.launcher import EngineLaunch, EngineLauncher, host_address

    launch = EngineLaunch(engine=FakeEngineConfig(), host="0.0.0.0", extra_args=("--log-level", "WARNING"),
                          startup_timeout_s=60)
    async with EngineLauncher(launch, tmp_path / "logs") as launcher:
        servers = json.loads(launcher.write_discovery(tmp_path / "discovery.json").read_text())["servers"]
        assert servers[0]["address"] == launcher.addresses[0]
        assert servers[0]["address"].rsplit(":", 1)[0] == host_address() != "0.0.0.0"
        async with Router.from_discovery_file(tmp_path / "discovery.json") as router:
            result = await router.generate(GenerateCall("s", [1, 2, 3], SamplingParams(max_new_tokens=2)))
            assert len(result.token_ids) == 2


@pytest.mark.parametrize("options, refused", [
    (["--ray", "--advertise-host", "10.0.0.9"], "--advertise-host does not apply with --ray"),
    (["--resources-per-server", '{"a": 1}'], "--resources-per-server applies with --ray only"),
    (["--ray", "--resources-per-server", "[1]"], "--resources-per-server: a JSON object"),
])
def test_launch_options_that_do_not_apply_are_refused(options, refused):
    # in process: the options are refused before any server, Ray or event loop starts
    result = CliRunner().invoke(app, ["engine", "launch", "--adapter", "fake", *options], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and refused in result.output, result.output


def test_a_killed_server_is_reported_and_restarted_and_a_router_following_the_file_uses_it(tmp_path):
    discovery = tmp_path / "discovery.json"
    launcher = subprocess.Popen(
        [*AGENTLOOP, "engine", "launch", "--adapter", "fake", "--dp", "2", "--restart-lost",
         "--discovery-file", str(discovery), "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = launcher.stdout.readline()
        assert "2 fake server(s) serving" in line, (line, launcher.stderr.read() if launcher.poll() else "")
        before = discovered(discovery)
        (rank1,) = [p for p in psutil.Process(launcher.pid).children() if "dp_rank=1" in p.cmdline()]
        rank1.kill()
        deadline = time.monotonic() + 60
        while discovered(discovery).get(1) in (None, before[1]):
            assert time.monotonic() < deadline and launcher.poll() is None, "rank 1 was not restarted"
            time.sleep(0.1)
        after = discovered(discovery)
        assert after[0] == before[0] and after[1] != before[1]

        async def route_to_the_new_server() -> set[str]:
            async with Router.from_discovery_file(discovery) as router:
                await router.fleet.wait_ready(min_servers=2, timeout_s=30)
                used: set[str] = set()
                for i in range(64):  # new sessions spread over equal loads by hash (see the dp2 test)
                    result = await router.generate(GenerateCall(f"s{i}", [1, 2, 3], SamplingParams(max_new_tokens=2)))
                    used.update(result.servers)
                    if len(used) == 2:
                        break
                return used

        assert asyncio.run(route_to_the_new_server()) == set(after.values())
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
    err = launcher.stderr.read()
    assert launcher.returncode == 0, err
    assert f"engine server {before[1]} (dp rank 1) lost: its process was killed by SIGKILL" in err, err
    assert f"engine server dp rank 1 restarted at {after[1]}" in err, err
    assert (tmp_path / "logs" / "engine-1.log").exists()  # the lost server's log is kept
    assert (tmp_path / "logs" / "engine-1.restart-1.log").exists()
    assert all(_closed(address) for address in after.values())


async def test_without_restart_a_lost_server_leaves_the_discovery_file_and_the_others_serve(tmp_path):
    discovery = tmp_path / "discovery.json"
    launch = EngineLaunch(engine=engine_config("fake"), dp=2)
    async with EngineLauncher(launch, tmp_path / "logs") as launcher:
        launcher.write_discovery(discovery)
        watching = launcher.watch(discovery)
        lost, kept = launcher.servers
        assert lost.process is not None
        lost.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while len(launcher.events) < 2:
            assert time.monotonic() < deadline, launcher.events
            await asyncio.sleep(0.05)
        assert [(kind, rank) for kind, rank, _ in launcher.events] == [("lost", 0), ("not restarted", 0)]
        assert "exited with code 0" in launcher.events[0][2] or "killed by SIGTERM" in launcher.events[0][2]
        assert discovered(discovery) == {1: kept.address} and launcher.addresses == [kept.address]
        async with Router.from_discovery_file(discovery) as router:
            result = await router.generate(GenerateCall("s", [1, 2, 3], SamplingParams(max_new_tokens=2)))
            assert result.servers == (kept.address,)
        assert not watching.done()  # the other rank is still watched
    assert watching.done() and kept.process is not None and kept.process.returncode is not None


async def test_a_server_that_keeps_dying_as_it_starts_is_restarted_after_a_growing_back_off(tmp_path):
    launch = EngineLaunch(engine=engine_config("fake"), dp=1)
    async with EngineLauncher(launch, tmp_path / "logs", restart_lost=True) as launcher:
        launcher.watch()
        for restarts in (1, 2):
            process = launcher.servers[0].process
            assert process is not None
            process.kill()
            deadline = time.monotonic() + 60
            while sum(kind == "restarted" for kind, _, _ in launcher.events) < restarts:
                assert time.monotonic() < deadline, launcher.events
                await asyncio.sleep(0.05)
        restarted = [message for kind, _, message in launcher.events if kind == "restarted"]
        # each ran seconds, not the minute that counts as stable: 1 s, then 2 s, before starting it again
        assert "(after a 1 s back-off: it had run" in restarted[0], restarted
        assert "(after a 2 s back-off: it had run" in restarted[1], restarted
        assert [kind for kind, _, _ in launcher.events] == ["lost", "restarted", "lost", "restarted"]
        assert [p.name for p in sorted((tmp_path / "logs").iterdir())] == [
            "engine-0.log", "engine-0.restart-1.log", "engine-0.restart-2.log"]  # each start's output kept
        async with Router([launcher.addresses[0]]) as router:
            result = await router.generate(GenerateCall("s", [1, 2, 3], SamplingParams(max_new_tokens=2)))
            assert len(result.token_ids) == 2


async def test_a_restart_that_cannot_even_spawn_is_reported_and_the_rank_stays_down(tmp_path, monkeypatch):
    """Whatever stops a restart, the launcher says "restart failed" (before, Ray's did, while this one's watcher
    died of the OSError with neither a restart nor that line)."""
    from agentloop_grpc.launch import launcher as launching

    monkeypatch.setattr(launching, "_BACKOFF_FIRST_S", 0.0)  # its first run is short: no back-off to wait here
    launcher = EngineLauncher(EngineLaunch(engine=engine_config("fake")), tmp_path / "logs", restart_lost=True)
    server = launcher.servers[0]
    server.address = "127.0.0.1:1"
    server.process = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")  # a server that exits at once
    server.args = [str(tmp_path / "removed-python"), *server.args[1:]]  # and whose interpreter is gone since
    try:
        await asyncio.wait_for(launcher.watch(), 10)
    finally:
        await launcher.stop()
    assert [kind for kind, _, _ in launcher.events] == ["lost", "restart failed"], launcher.events
    assert "removed-python" in launcher.events[1][2] and launcher.addresses == []
