"""The per-node launcher: one engine server process per data-parallel group, ports chosen, health awaited, and a
discovery file that ``Router.from_discovery_file`` reads.

Each server is ``agentloop engine serve --adapter KIND --port 0 --set dp_rank=i --set dp_size=N ...`` in its own
process (its own GIL, its own torch threads), its engine config passed as ``--set`` flags (``config_flags``),
started together so model loading overlaps. A server prints ``listening on HOST:PORT`` once
bound; the launcher then waits until its ``grpc.health.v1`` status is SERVING (the model loaded). Stopping sends
SIGTERM (servers drain) and SIGKILL after a grace period. Server output goes to one log file per server, so the
caller's terminal stays readable and a failed start can quote the log's tail.

Once started, ``EngineLauncher.watch`` follows the servers until stopped, as ``RayEngineLauncher.watch`` does on
a cluster: a server whose process exits is lost; the loss is logged (server, DP rank, exit status, log file) and the
discovery file rewritten without it; with ``restart_lost`` the server is started again (a new port, its output in
a new log file, the old one kept for the post-mortem) and its address written back, where a Router following the
file (``follow_discovery_file``) picks it up and holds it out of routing until it reports the fleet's weights. A
server lost within a minute of its start is started again after a back-off (1 s, doubling with each such loss in a
row, up to a minute; either launcher): a crash loop does not reload the model back to back. A restart that fails,
whatever stops it, leaves the rank down with a "restart failed" event. The loop is ``Launcher._watch_rank``, one for
both launchers; ``Launcher.run_until_stopped`` is ``agentloop engine launch`` (``serving.supervise``: a SIGTERM
while the servers start stops them).

The same ``ServerProcess`` starts tool servers (``agentloop tools serve``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop_grpc.channels import open_channel
from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.engine_adapters.config import EngineConfig, engine_config
from agentloop_grpc.engine_adapters.config_flags import settings
from agentloop_grpc.engine_adapters.embedded.config import EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.model_check import ModelNotFoundError, check_model
from agentloop_grpc.serving.server import stop_signal
from agentloop_grpc.serving.server_security import ServerSecurity
from agentloop_grpc.serving.supervise import supervise

_LISTENING = re.compile(r"listening on (\S+)")

log = logging.getLogger(__name__)

#: A lost server that had run this long is started again at once; one lost sooner waits _BACKOFF_FIRST_S, doubling
#: with each further quick loss up to _BACKOFF_MAX_S, so a server that dies as it starts is not reloaded back to back.
_STABLE_S = 60.0
_BACKOFF_FIRST_S = 1.0
_BACKOFF_MAX_S = 60.0


_PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    """A server did not start (its log's tail is in the message)."""


#: Bind addresses that mean "every interface": no client can dial them from another machine.
_UNSPECIFIED = frozenset({"0.0.0.0", "::", "[::]", ""})
_SIOCGIFADDR = 0x8915


def host_address() -> str:
    """This host's address as other machines reach it: the source address of its route to a public address (a UDP
    socket connected, no packet sent: what Ray's ``get_node_ip_address`` and vLLM's ``get_ip`` do), else, without
    a default route (a private cluster network), the first IPv4 address of an interface other than loopback, else
    127.0.0.1."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("8.8.8.8", 80))
        address = probe.getsockname()[0]
        if not address.startswith("127.") and address != "0.0.0.0":
            return address
    return next(iter(interface_addresses()), "127.0.0.1")


def interface_addresses() -> list[str]:
    """The IPv4 addresses of this host's interfaces other than loopback (Linux: SIOCGIFADDR; elsewhere none)."""
    try:
        import fcntl
        import struct
    except ImportError:
        return []
    found = []
    for _, name in socket.if_nameindex():
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127."):
                found.append(address)
    return found


def advertised_host(host: str, advertise_host: str | None = None) -> str:
    """The host clients dial for a server bound to ``host``: ``advertise_host`` when given, else ``host`` itself,
    or this host's address (``host_address``) when ``host`` is unspecified (0.0.0.0, ::)."""
    chosen = advertise_host or (host_address() if host in _UNSPECIFIED else host)
    return f"[{chosen}]" if ":" in chosen and not chosen.startswith("[") else chosen


#: The child's side of ``ServerProcess.terminate_with_parent`` (Linux), run as ``python -c _ORPHAN_GUARD PARENT_PID
#: PROGRAM ARG...``: it asks the kernel for SIGTERM when its parent dies (the request survives exec), exits if the
#: parent died already, then becomes the program. Not a preexec_fn: that runs Python in the forked child, unsafe once
#: the parent has threads (gRPC's): a replica a rollout's launcher restarted that way died of SIGSEGV before exec.
_ORPHAN_GUARD = (
    "import ctypes, os, signal, sys\n"
    f"ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def agentloop_command() -> list[str]:
    """The CLI of this installation, run with this interpreter (works in a venv without activating it)."""
    return [sys.executable, "-m", "agentloop_grpc.cli"]


@dataclass
class ServerProcess:
    """One server process started from ``args`` (an agentloop CLI command that prints its address)."""

    args: Sequence[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    #: Stop the server when its starter dies (Linux only): for starters that can be killed without notice.
    terminate_with_parent: bool = False
    #: How to reach the server for its health checks (TLS: which CA to trust, the client certificate).
    security: ClientSecurity | None = None
    #: The host clients dial, when not the one the server prints (it binds 0.0.0.0): ``address`` is this host and
    #: the printed port, and the health checks dial it.
    advertise_host: str | None = None
    process: asyncio.subprocess.Process | None = None
    address: str | None = None
    # held so the event loop's weak reference is not the only one while the task reads
    _stdout_drain: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def start(self, timeout_s: float) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        # a server that must not outlive its starter (e.g. one a Ray actor started, when the actor is killed)
        guard = [sys.executable, "-c", _ORPHAN_GUARD, str(os.getpid())] if self.terminate_with_parent else []
        try:
            self.process = await asyncio.create_subprocess_exec(
                *guard, *self.args, stdout=asyncio.subprocess.PIPE, stderr=log, env={**os.environ, **self.env},
                start_new_session=True,  # Ctrl-C in the caller's terminal reaches the caller, which stops us
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        while self.address is None:
            try:
                line = await asyncio.wait_for(self.process.stdout.readline(), max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                raise LaunchError(f"{self.args[3:5]} did not print its address within {timeout_s:.0f} s"
                                  f"{self._tail()}") from None
            if not line:
                code = await self.process.wait()
                raise LaunchError(f"{' '.join(self.args[3:5])} exited with code {code} before listening{self._tail()}")
            match = _LISTENING.search(line.decode(errors="replace"))
            if match:
                self.address = match.group(1)
                if self.advertise_host:
                    self.address = f"{self.advertise_host}:{self.address.rsplit(':', 1)[1]}"
        self._stdout_drain = asyncio.ensure_future(self._drain_stdout())
        await self._wait_serving(deadline)
        return self.address

    async def _drain_stdout(self) -> None:
        with contextlib.suppress(Exception):
            while await self.process.stdout.readline():
                pass

    async def _wait_serving(self, deadline: float) -> None:
        async with open_channel(self.address, self.security) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.process.returncode is not None:
                    raise LaunchError(f"the server at {self.address} exited while loading{self._tail()}")
                with contextlib.suppress(grpc.aio.AioRpcError):
                    # typeshed's HealthStub declares no methods
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)  # type: ignore[attr-defined]
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                if time.monotonic() > deadline:
                    raise LaunchError(f"the server at {self.address} was not SERVING in time{self._tail()}")
                await asyncio.sleep(0.2)

    def _tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return (f"; the end of {self.log_path}:\n  " + "\n  ".join(text)) if text else ""

    async def stop(self, grace_s: float) -> int | None:
        if self.process is None or self.process.returncode is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), grace_s)
        except TimeoutError:
            self.process.kill()
            return await self.process.wait()


@dataclass(frozen=True)
class EngineLaunch:
    """What to launch on this node: ``dp`` servers of one engine config."""

    #: The engine every server serves; each gets its own dp_rank and dp_size.
    engine: EngineConfig = field(default_factory=EmbeddedEngineConfig)
    dp: int = 1
    host: str = "127.0.0.1"
    #: The host clients dial (the discovery file's addresses): default ``host``, or this host's address when
    #: ``host`` is 0.0.0.0 or :: (``advertised_host``).
    advertise_host: str | None = None
    #: More ``agentloop engine serve`` options, e.g. ("--log-level", "WARNING").
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 300.0
    #: TLS and tokens of every server (paths and variable names: each server reads them on its node).
    security: ServerSecurity | None = None
    #: How clients reach the servers (the launcher's health checks, and what the discovery file tells routers).
    client_security: ClientSecurity | None = None

    def __post_init__(self) -> None:
        if self.dp < 1:
            raise ValueError("dp must be >= 1")

    @classmethod
    def of(cls, adapter: str, config: Mapping[str, Any], **options: Any) -> EngineLaunch:
        """Servers of ``adapter`` with ``config``'s fields validated as its config (the error names the field):
        for callers that know an adapter by name and must not import the adapters' configs themselves."""
        return cls(engine=engine_config(adapter, config), **options)

    @property
    def adapter(self) -> str:
        return self.engine.kind

    @property
    def advertised(self) -> str:
        """The host in the servers' addresses (see ``advertised_host``)."""
        return advertised_host(self.host, self.advertise_host)

    def server_engine(self, rank: int) -> EngineConfig:
        """Server ``rank``'s config: DP group ``rank`` of ``dp``; an embedded engine whose threads are not set
        shares the node's cores with the other servers."""
        update: dict[str, int] = {"dp_rank": rank, "dp_size": self.dp}
        if isinstance(self.engine, EmbeddedEngineConfig) and "threads" not in self.engine.model_fields_set:
            update["threads"] = max(1, (os.cpu_count() or 1) // self.dp)
        return self.engine.model_copy(update=update)

    def command(self, rank: int) -> list[str]:
        args = [*agentloop_command(), "engine", "serve", "--adapter", self.adapter, "--host", self.host, "--port", "0"]
        for setting in settings(self.server_engine(rank)):
            args += ["--set", setting]
        if self.security is not None:
            args += self.security.cli_args()
        return args + list(self.extra_args)


class Launcher(abc.ABC):
    """What a launcher of engine servers does, here or on a Ray cluster: ``async with`` starts them and stops them
    whatever happens; ``addresses`` once started; ``watch`` follows them until stopped, one loop for both (each
    launcher's ``_wait_lost``, ``_start_again`` and ``_give_up`` say what a loss is, how a server is started again
    and what a server down for good releases); ``run_until_stopped`` is ``agentloop engine launch``."""

    launch: EngineLaunch

    def __init__(self, restart_lost: bool = False) -> None:
        #: Whether ``watch`` starts a lost server again.
        self.restart_lost = restart_lost
        #: What ``watch`` saw, in order: (kind, rank, message); kinds "lost", "restarted", "restart failed",
        #: "not restarted".
        self.events: list[tuple[str, int, str]] = []
        self._watching: asyncio.Future | None = None
        #: When each rank's server was last (re)started, as ``watch`` saw it; its quick losses in a row.
        self._up_since: dict[int, float] = {}
        self._quick_losses: dict[int, int] = {}

    @property
    @abc.abstractmethod
    def addresses(self) -> list[str]: ...

    @abc.abstractmethod
    async def start(self) -> list[str]: ...

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    def write_discovery(self, path: str | Path) -> Path: ...

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.stop()

    def watch(self, discovery_file: str | Path | None = None) -> asyncio.Future:
        """Follow the servers until ``stop``: report each loss, rewrite ``discovery_file`` (when given) and, where
        the launcher restarts lost servers, start them again. Returns the future doing it."""
        if self._watching is None:
            path = Path(discovery_file) if discovery_file is not None else None
            self._up_since = dict.fromkeys(range(self.launch.dp), time.monotonic())
            self._watching = asyncio.gather(*(self._follow(rank, path) for rank in range(self.launch.dp)))
        return self._watching

    async def run_until_stopped(self, discovery_file: str | Path, on_serving: Callable[[Path], object]) -> None:
        """Start the servers, write ``discovery_file``, tell ``on_serving`` its path and watch them until SIGTERM or
        SIGINT, then stop them; a signal while they start stops what started (``serving.supervise``)."""
        stop = stop_signal()

        def serving(_addresses: list[str]) -> None:
            path = self.write_discovery(discovery_file)
            on_serving(path)
            self.watch(path)  # losses reported (and restarted) until stopped

        await supervise(self.start, self.stop, stop, serving)

    @abc.abstractmethod
    async def _wait_lost(self, rank: int) -> str:
        """Wait until ``rank``'s server is lost, take it out of ``addresses`` and say what was lost and why."""

    @abc.abstractmethod
    async def _start_again(self, rank: int) -> str:
        """Start ``rank``'s lost server again, into ``addresses``; say where it serves ("at HOST:PORT"). Raises
        what stopped it, having cleaned up after itself."""

    async def _give_up(self, rank: int) -> str:
        """``rank`` stays down for good: release what it still holds; say what was released."""
        return ""

    async def _watch_rank(self, rank: int, discovery_file: Path | None) -> None:
        """Until ``rank``'s server is lost for good: wait for its loss, report it, restart it."""
        while True:
            lost = await self._wait_lost(rank)
            lost_at = time.monotonic()
            self._event("lost", rank, lost, logging.ERROR)
            self._write(discovery_file)
            if not self.restart_lost:
                released = await self._give_up(rank)
                self._event("not restarted", rank, f"dp rank {rank} stays down (restart_lost is off){released}",
                            logging.WARNING)
                return
            waited = await self._back_off(rank, lost_at)
            try:
                where = await self._start_again(rank)
            except Exception as error:  # noqa: BLE001 - a timeout, an executable gone, a Ray error: down, said so
                released = await self._give_up(rank)
                self._event("restart failed", rank, f"dp rank {rank} could not be restarted, it stays down{released}: "
                            f"{error}", logging.ERROR)
                return
            self._restarted(rank)
            self._write(discovery_file)
            self._event("restarted", rank, f"engine server dp rank {rank} restarted {where}, "
                        f"{time.monotonic() - lost_at:.1f} s after the loss{waited}", logging.WARNING)

    async def _follow(self, rank: int, discovery_file: Path | None) -> None:
        try:
            await self._watch_rank(rank, discovery_file)
        except Exception:  # a bug here must not pass unnoticed until stop()
            log.exception("watching dp rank %d failed; its server is no longer watched", rank)

    async def _back_off(self, rank: int, lost_at: float) -> str:
        """Wait before ``rank``'s lost server is started again (the module constants say how long); returns what
        the restart's message adds about it."""
        lived = lost_at - self._up_since[rank]
        if lived >= _STABLE_S:
            self._quick_losses[rank] = 0
            return ""
        delay = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** self._quick_losses.get(rank, 0))
        self._quick_losses[rank] = self._quick_losses.get(rank, 0) + 1
        await asyncio.sleep(delay)
        return f" (after a {delay:.0f} s back-off: it had run {lived:.1f} s)"

    def _restarted(self, rank: int) -> None:
        self._up_since[rank] = time.monotonic()

    async def _stop_watching(self) -> None:
        """First thing in ``stop``: a server stopped there is no loss."""
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(BaseException):
                await self._watching
            self._watching = None

    def _event(self, kind: str, rank: int, message: str, level: int) -> None:
        log.log(level, "%s", message)
        self.events.append((kind, rank, message))

    def _write(self, discovery_file: Path | None) -> None:
        if discovery_file is not None:
            self.write_discovery(discovery_file)


class EngineLauncher(Launcher):
    """Start ``launch.dp`` engine servers as local processes."""

    def __init__(self, launch: EngineLaunch, log_dir: str | Path, grace_s: float = 10.0,
                 terminate_with_parent: bool = False, restart_lost: bool = False) -> None:
        """``terminate_with_parent``: the servers stop when this process dies, however it dies (servers that
        belong to one run, not ones an ``agentloop engine launch`` keeps up). ``restart_lost``: ``watch`` starts a
        lost server again (the module docstring)."""
        super().__init__(restart_lost)
        self.launch = launch
        self.log_dir = Path(log_dir)
        self.grace_s = grace_s
        self.servers = [
            ServerProcess(launch.command(rank), self.log_dir / f"engine-{rank}.log", security=launch.client_security,
                          terminate_with_parent=terminate_with_parent, advertise_host=launch.advertised)
            for rank in range(launch.dp)
        ]
        self._down: set[int] = set()
        self._restarts = [0] * launch.dp  # per rank: names each restart's log file

    @property
    def addresses(self) -> list[str]:
        return [s.address for rank, s in enumerate(self.servers) if s.address and rank not in self._down]

    async def start(self) -> list[str]:
        try:  # before any process spawns: a server announces itself first and finds a bad model only after
            check_model(self.launch.engine)
        except ModelNotFoundError as error:
            raise LaunchError(str(error)) from None
        try:
            await asyncio.gather(*(s.start(self.launch.startup_timeout_s) for s in self.servers))
        except BaseException:
            await self.stop()
            raise
        return self.addresses

    async def stop(self) -> None:
        await self._stop_watching()
        await asyncio.gather(*(s.stop(self.grace_s) for s in self.servers))

    def write_discovery(self, path: str | Path) -> Path:
        """``{"servers": [{"address", "dp_rank", "adapter"}...]}``: what ``Router.from_discovery_file`` reads; a
        lost server is left out until it is restarted."""
        servers = [{"address": s.address, "dp_rank": rank, "adapter": self.launch.adapter}
                   for rank, s in enumerate(self.servers) if s.address and rank not in self._down]
        return write_discovery(path, servers, self.launch.client_security)

    # -- watching (the module docstring) ----------------------------------------------------------------------

    async def _wait_lost(self, rank: int) -> str:
        server = self.servers[rank]
        assert server.process is not None  # started
        code = await server.process.wait()
        self._down.add(rank)
        return (f"engine server {server.address} (dp rank {rank}) lost: its process {_exit_status(code)} (its log: "
                f"{server.log_path})")

    async def _start_again(self, rank: int) -> str:
        self._restarts[rank] += 1
        log_path = self.log_dir / f"engine-{rank}.restart-{self._restarts[rank]}.log"
        server = self.servers[rank] = dataclasses.replace(self.servers[rank], log_path=log_path, process=None,
                                                          address=None)
        try:
            await server.start(self.launch.startup_timeout_s)
        except BaseException:
            await server.stop(self.grace_s)
            raise
        self._down.discard(rank)
        return f"at {server.address}"


def _exit_status(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def write_discovery(
    path: str | Path, servers: Sequence[Mapping[str, object]], security: ClientSecurity | None = None
) -> Path:
    """Write ``{"servers": [...], "security": {...}}``; each server entry has at least ``address``, and
    ``security`` (only when the servers need TLS or tokens) is a ``ClientSecurity``: the paths of the CA and the
    token files or the names of the token variables, never a secret (see ``router.discovery_addresses``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    document: dict[str, object] = {"servers": servers}
    if security is not None:
        document["security"] = security.model_dump(exclude_defaults=True)
    # whole to a temporary file, then renamed: a Router following the file never reads half of it
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    temporary.replace(path)
    return path
