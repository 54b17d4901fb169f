"""Workspace: one trajectory's sandbox, a fresh copy of the task's repository a coding CLI works in.

What holds, each tried by an escape test (tests/harness/test_workspace.py):
  - a jail of ``common/jail.py`` (bubblewrap; its ``JailSpec`` builds every bwrap command line of ours), every
    capability dropped: new mount, PID, IPC, UTS and network namespaces; the filesystem is read-only but for the
    workspace (``/app``, the repository's copy), the CLI's home (``/home/agent``), ``/logs`` and a private ``/tmp``
    (a tmpfs of ``tmp_bytes``); nothing of the host but what is bound read-only (/usr, ``jail.system_paths()``, the
    interpreter, the CLIs' packages, even from under the host's /tmp) is visible, so no trajectory sees another's
    files;
  - no network but the trajectory's gateway session: the sandbox's own loopback holds a forwarder on
    ``127.0.0.1:GATEWAY_PORT`` whose only way out is a Unix socket to the gateway (bound in from the host), where
    the session's key opens that session's routes alone (gateway/agents.py);
  - the process tree in a cgroup of its own (cgroup.py): its memory and its number of processes bounded together,
    so a fork bomb or a leak ends this trajectory alone; rlimits per process: CPU seconds, file size, no core;
  - wall-clock time and disk: past ``wall_timeout_s``, or once the workspace and home hold more than
    ``disk_bytes`` (a watchdog measures them), everything in the sandbox is killed;
  - bounded output: at most ``output_bytes`` of what the CLI writes is kept;
  - on ``close()`` every process is killed (the PID namespace dies with its first process, the cgroup is emptied)
    and the folders are removed.
A workspace that cannot be made (no bwrap, a repository that cannot be copied) is an infrastructure failure named
by ``WorkspaceError.cause``, never the model's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentloop_grpc.common.jail import JailSpec, Rlimits, Tmpfs, probe_cached, system_paths

from . import cgroup

#: Where the sandbox sees its folders.
APP = "/app"
HOME = "/home/agent"
LOGS = "/logs"
RUN = "/run/agentloop"
#: The loopback port of the gateway inside every sandbox (each sandbox has its own loopback).
GATEWAY_PORT = 8000

#: Inside the sandbox: listen on the gateway port, bridge each connection to the host's Unix socket, and run the CLI
#: (argv after the socket path) as a child once listening, so the CLI never races the forwarder; exit with its code.
_FORWARDER = r"""
import os, socket, sys, threading
port, path, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(64)
child = os.fork()
if child == 0:
    listener.close()
    os.execvp(argv[0], argv)

def pipe(src, dst):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

def serve():
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()

threading.Thread(target=serve, daemon=True).start()
_, status = os.waitpid(child, 0)
code = os.waitstatus_to_exitcode(status)
os._exit(128 - code if code < 0 else code)  # killed by a signal: 128 + its number, as a shell says it
"""


class WorkspaceError(Exception):
    """A workspace that could not be made or run: an infrastructure failure, ``cause`` naming what failed."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True, slots=True)
class WorkspaceLimits:
    """Bounds of one workspace run."""

    wall_timeout_s: float = 600.0
    #: CPU seconds of each process (RLIMIT_CPU).
    cpu_seconds: int = 600
    #: Memory of the whole process tree (its cgroup).
    memory_bytes: int = 4 * 2**30
    #: Processes and threads of the whole tree at once (its cgroup).
    max_processes: int = 512
    #: What the workspace and the home may hold together (a watchdog), and the largest file (RLIMIT_FSIZE).
    disk_bytes: int = 2**30
    #: What is kept of the CLI's output (stdout and stderr together).
    output_bytes: int = 2**20
    tmp_bytes: int = 256 * 2**20

    def __post_init__(self) -> None:
        if self.wall_timeout_s <= 0 or self.cpu_seconds < 1 or self.memory_bytes < 64 * 2**20:
            raise ValueError("wall_timeout_s > 0, cpu_seconds >= 1 and memory_bytes >= 64 MiB required")
        if self.max_processes < 4 or self.disk_bytes < 2**20 or self.output_bytes < 1 or self.tmp_bytes < 2**20:
            raise ValueError("max_processes >= 4, disk_bytes and tmp_bytes >= 1 MiB, output_bytes >= 1 required")


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a command in the workspace ended."""

    #: Its exit code (killed by a signal: 128 + its number, as a shell reports it); None when the sandbox was killed
    #: for a bound.
    exit_code: int | None
    #: What it wrote (stdout and stderr), at most ``output_bytes`` of it, decoded.
    output: str
    #: Whether output was cut at ``output_bytes``.
    truncated: bool
    #: Which bound ended it (``workspace_timeout``, ``workspace_disk``, ``workspace_memory``), else None.
    cause: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.cause is None and self.exit_code == 0


def python_prefixes() -> tuple[Path, ...]:
    """What an interpreter of this venv needs bound: the venv and the Python it was made from."""
    # the venv as named (sys.executable lies under it) and as resolved (a link to it leads there)
    named = (Path(q) for q in (sys.prefix, sys.base_prefix))
    return tuple(dict.fromkeys(p for q in named for p in (q.absolute(), q.resolve())))


class Workspace:
    """A fresh copy of ``repo`` under ``root`` (see the module docstring); ``run`` runs a command in it, ``close``
    kills what is left and removes it. Use ``async with await Workspace.create(...)``."""

    def __init__(self, folder: Path, limits: WorkspaceLimits) -> None:
        self.folder = folder
        self.limits = limits
        self.app = folder / "app"
        self.home = folder / "home"
        #: What the commands leave for the host to read (a verifier's reward and report): /logs.
        self.logs = folder / "logs"
        # the bridge's socket: a Unix socket path must stay within 108 bytes, which a deep workspace root breaks
        self._run = Path(tempfile.gettempdir()) / f"agentloop-{folder.name}"
        self._process: asyncio.subprocess.Process | None = None
        self._group: cgroup.Group | None = None

    @classmethod
    async def create(cls, root: Path, repo: Path | None, limits: WorkspaceLimits | None = None,
                     leave_out: Sequence[str] = ()) -> Workspace:
        """A workspace holding a copy of ``repo`` (None: empty) less the files named ``leave_out``;
        WorkspaceError(``workspace_create``) when it cannot be made."""
        if (why := await asyncio.to_thread(probe_cached)) is not None:
            raise WorkspaceError("workspace_sandbox", f"no sandbox for the workspace: {why}")
        folder = root / f"ws-{uuid.uuid4().hex[:12]}"
        workspace = cls(folder, limits or WorkspaceLimits())
        try:
            await asyncio.to_thread(workspace._populate, repo, leave_out)
        except OSError as error:
            await workspace.close()
            raise WorkspaceError("workspace_create", f"the workspace could not be made from {repo}: {error}") from None
        return workspace

    def _populate(self, repo: Path | None, leave_out: Sequence[str]) -> None:
        self.folder.mkdir(parents=True)
        if repo is not None:
            shutil.copytree(repo, self.app, symlinks=True, ignore=shutil.ignore_patterns(*leave_out))
        else:
            self.app.mkdir()
        for folder in (self.home, self.logs / "verifier"):
            folder.mkdir(parents=True)
        self._run.mkdir(mode=0o700)

    async def __aenter__(self) -> Workspace:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                  gateway: tuple[str, int] | None = None, binds: Sequence[Path] = (),
                  extra: Mapping[str, Path] | None = None) -> RunResult:
        """``argv`` in the sandbox, in /app, with ``env`` (and HOME, PATH); ``gateway``: the (host, port) the
        sandbox's 127.0.0.1:GATEWAY_PORT reaches; ``binds``: host folders it may read (the CLI's package);
        ``extra``: more read-only folders by where the sandbox sees them (a task's tests at /tests)."""
        if self._process is not None:
            raise RuntimeError("a workspace runs one command at a time")
        limits = self.limits
        bridge = await self._bridge(gateway) if gateway is not None else None
        name = self.folder.name
        self._group = await asyncio.to_thread(cgroup.create, name, limits.memory_bytes, limits.max_processes)
        command = self._command(argv, env or {}, gateway is not None, binds, extra or {})
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            self._process = await asyncio.create_subprocess_exec(
                *command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, env={"PATH": "/usr/bin:/bin"},
            )
        except OSError as error:
            await self._end_run(bridge)
            raise WorkspaceError("workspace_sandbox", f"the sandbox could not start: {error}") from None
        reader = asyncio.create_task(self._read(self._process))
        cause: str | None = None
        try:
            cause = await self._watch(self._process, limits)
            output, truncated = await reader
        finally:
            reader.cancel()
            code = self._process.returncode
            if self._group is not None and self._group.out_of_memory() and cause is None and code != 0:
                cause = "workspace_memory"
            await self._end_run(bridge)
        return RunResult(None if cause is not None else code, output.decode("utf-8", "replace"), truncated, cause,
                         round(loop.time() - started, 3))

    def _command(self, argv: Sequence[str], env: Mapping[str, str], bridged: bool, binds: Sequence[Path],
                 extra: Mapping[str, Path]) -> list[str]:
        limits = self.limits
        python = Path(sys.executable)
        readable = [str(p) for p in dict.fromkeys([*python_prefixes(), *(Path(b).resolve() for b in binds)])]
        elsewhere = [(str(path), inside) for inside, path in extra.items()]
        paths = ":".join(dict.fromkeys([*(str(Path(b).resolve() / "bin") for b in binds), str(python.parent),
                                        "/usr/local/bin", "/usr/bin", "/bin"]))
        spec = JailSpec(
            read_only=(*system_paths(), *readable, *elsewhere, (str(self._run), RUN)),
            writable=((str(self.app), APP), (str(self.home), HOME), (str(self.logs), LOGS)),
            tmpfs=(Tmpfs("/tmp", limits.tmp_bytes),),
            chdir=APP,
            env={"HOME": HOME, "PATH": paths, "TMPDIR": "/tmp", "LANG": "C.UTF-8", **env},
            read_only_root=True,  # nothing but the writable binds and /tmp can be written
        )
        inner = [str(python), "-c", _FORWARDER, str(GATEWAY_PORT), f"{RUN}/gateway.sock", *argv] if bridged \
            else list(argv)
        rlimits = Rlimits(cpu_seconds=limits.cpu_seconds, file_bytes=limits.disk_bytes, core_bytes=0)
        limited = [*rlimits.argv(), *spec.argv(inner)]
        if self._group is None:
            return limited
        # enter the cgroup before bwrap starts, so nothing it runs is ever outside it
        joins = "; ".join(f"echo $$ > {procs}" for procs in self._group.procs_files)
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *limited]

    async def _bridge(self, gateway: tuple[str, int]) -> asyncio.Server:
        host, port = gateway

        async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

        return await asyncio.start_unix_server(connect, path=str(self._run / "gateway.sock"))

    async def _read(self, process: asyncio.subprocess.Process) -> tuple[bytes, bool]:
        assert process.stdout is not None
        kept, truncated = bytearray(), False
        while chunk := await process.stdout.read(65536):
            room = self.limits.output_bytes - len(kept)
            if len(chunk) > room:
                truncated = True
            kept += chunk[: max(room, 0)]  # read on past the bound: a writer blocked on a full pipe never ends
        return bytes(kept), truncated

    async def _watch(self, process: asyncio.subprocess.Process, limits: WorkspaceLimits) -> str | None:
        """Wait for the process; the bound it crossed (it is then killed), else None."""
        deadline = asyncio.get_running_loop().time() + limits.wall_timeout_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                self._kill()
                await process.wait()
                return "workspace_timeout"
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), min(left, 0.5))
                return None
            except TimeoutError:
                pass
            if await asyncio.to_thread(_disk_used, (self.app, self.home, self.logs)) > limits.disk_bytes:
                self._kill()
                await process.wait()
                return "workspace_disk"

    def _kill(self) -> None:
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)

    async def _end_run(self, bridge: asyncio.Server | None) -> None:
        self._kill()
        if self._process is not None and self._process.returncode is None:
            await self._process.wait()
        self._process = None
        if self._group is not None:
            await asyncio.to_thread(self._group.kill)
            self._group = None
        if bridge is not None:
            bridge.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(bridge.wait_closed(), 5)

    async def close(self) -> None:
        """Kill whatever runs and remove the folders."""
        await self._end_run(None)
        await asyncio.to_thread(shutil.rmtree, self.folder, ignore_errors=True)
        await asyncio.to_thread(shutil.rmtree, self._run, ignore_errors=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


def _disk_used(folders: Sequence[Path]) -> int:
    total = 0
    for folder in folders:
        for base, _, files in os.walk(folder):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(base, name)).st_blocks * 512
    return total
