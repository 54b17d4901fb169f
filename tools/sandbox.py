"""A sandboxed Python session: one process per tool instance, variables kept between calls.

Isolation, in layers (each one tested by trying the escape):
  - bubblewrap (``bwrap``): new mount, PID, IPC, UTS and network namespaces; the filesystem is /usr read-only
    plus a private working folder mounted at /work; no network at all (a loopback of its own, nothing on it);
  - an unprivileged uid per instance (when the server runs as root), so RLIMIT_NPROC bounds a fork bomb;
  - rlimits (set by util-linux's prlimit, which execs the sandbox): address space (memory), CPU seconds,
    processes, file size, open files;
  - a wall-clock timeout per call (the session is killed and restarted; the model is told its variables are gone);
  - bounded output: the runner keeps at most ``output_bytes`` of what the code prints;
  - a clean environment: nothing of the server's environment reaches the session (bwrap itself starts with an
    empty one, so not even /proc/1/environ shows it).
Where bwrap cannot run, ``isolation()`` says so and the python tool's description carries that warning: the
session then still has rlimits, a uid and a timeout, but shares the host's network and filesystem view.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_RUNNER = r"""
import ast, io, json, os, sys, traceback
LIMIT = int(sys.argv[1])
channel = os.fdopen(os.dup(1), "w")
requests = os.fdopen(os.dup(0), "r")
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)

class Bounded(io.TextIOBase):
    def __init__(self):
        self.parts, self.size, self.truncated = [], 0, False
    def writable(self):
        return True
    def write(self, text):
        room = LIMIT - self.size
        if room > 0:
            self.parts.append(text[:room])
        if len(text) > max(room, 0):
            self.truncated = True
        self.size += len(text)
        return len(text)
    def value(self):
        return "".join(self.parts)

namespace = {"__name__": "__main__"}
MAIN = os.getpid()
for line in requests:
    code = json.loads(line)["code"]
    out, err = Bounded(), Bounded()
    sys.stdout, sys.stderr = out, err
    error = None
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
            if value is not None:
                print(repr(value))
    except BaseException as exc:
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        error = "".join(lines[-6:])
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    if os.getpid() != MAIN:  # a process the code forked: it must not answer for the session
        os._exit(0)
    channel.write(json.dumps({"stdout": out.value(), "stderr": err.value(), "error": error,
                              "truncated": out.truncated or err.truncated, "printed": out.size + err.size}) + "\n")
    channel.flush()
"""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Limits of one sandboxed session."""

    wall_timeout_s: float = 10.0
    cpu_seconds: int = 60
    memory_bytes: int = 512 * 1024 * 1024
    output_bytes: int = 16 * 1024
    max_processes: int = 16
    file_bytes: int = 16 * 1024 * 1024
    open_files: int = 64

    def __post_init__(self) -> None:
        if self.wall_timeout_s <= 0 or self.cpu_seconds < 1 or self.memory_bytes < 64 * 1024 * 1024:
            raise ValueError("wall_timeout_s > 0, cpu_seconds >= 1 and memory_bytes >= 64 MiB required")
        if self.output_bytes < 1 or self.max_processes < 1 or self.file_bytes < 1 or self.open_files < 8:
            raise ValueError("output_bytes, max_processes and file_bytes >= 1, open_files >= 8 required")


def _interpreter() -> str:
    """A Python readable by any uid (the system one), so the unprivileged session can start it."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return os.path.realpath(shutil.which("python3") or "python3")


def _bwrap_args(workdir: Path, interpreter: str) -> list[str]:
    args = ["bwrap", "--ro-bind", "/usr", "/usr"]
    for link in ("lib", "lib64", "bin", "sbin"):
        if Path("/usr", link).exists():
            args += ["--symlink", f"usr/{link}", f"/{link}"]
    prefix = str(Path(interpreter).resolve().parent.parent)
    if not prefix.startswith("/usr"):
        args += ["--ro-bind", prefix, prefix]
    return args + [
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        "--bind", str(workdir), "/work", "--chdir", "/work",
        "--unshare-all", "--die-with-parent", "--new-session",
        "--clearenv", "--setenv", "HOME", "/work", "--setenv", "PATH", "/usr/bin:/bin",
    ]


def probe_isolation() -> str | None:
    """None when bwrap isolates here; otherwise why it cannot (said loudly by the server)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    with tempfile.TemporaryDirectory() as workdir:
        try:
            result = subprocess.run(
                [*_bwrap_args(Path(workdir), _interpreter()), _interpreter(), "-c", "pass"],
                capture_output=True, text=True, timeout=30, env={},
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"bwrap failed to start: {error}"
    return None if result.returncode == 0 else f"bwrap cannot create namespaces here: {result.stderr.strip()}"


class PythonSession:
    """One sandboxed interpreter; ``run`` executes code in its persistent namespace."""

    def __init__(self, limits: SandboxLimits, uids: Iterator[int] | None, isolated: bool, root: Path) -> None:
        """``uids`` yields a fresh unprivileged uid for every (re)start (None: keep ours, when not root), so
        processes of a killed session still exiting cannot eat the new one's process limit."""
        self._limits = limits
        self._uids = uids
        self._uid: int | None = None
        self._isolated = isolated
        self.workdir = Path(tempfile.mkdtemp(prefix="session-", dir=root))
        self._process: asyncio.subprocess.Process | None = None
        self._starts = 0

    def _prlimit(self) -> list[str]:
        """rlimits through util-linux's prlimit, which execs the sandbox with them: no Python code runs between
        fork and exec (a preexec_fn in a process with gRPC's threads can crash the child)."""
        limits = self._limits
        return [
            "prlimit",
            f"--as={limits.memory_bytes}",
            f"--cpu={limits.cpu_seconds}",
            f"--nproc={limits.max_processes}",
            f"--fsize={limits.file_bytes}",
            f"--nofile={limits.open_files}",
            "--core=0",
            "--",
        ]

    async def _start(self) -> asyncio.subprocess.Process:
        self._starts += 1
        if self._uids is not None:
            self._uid = next(self._uids)
            os.chown(self.workdir, self._uid, self._uid)
            for entry in self.workdir.rglob("*"):
                os.lchown(entry, self._uid, self._uid)
        interpreter = _interpreter()
        command = [interpreter, "-I", "-S", "-c", _RUNNER, str(self._limits.output_bytes)]
        if self._isolated:
            command = _bwrap_args(self.workdir, interpreter) + command
        # The uid is dropped by util-linux's setpriv, not by subprocess's user=/group=: those make Python fork
        # instead of vfork, and a forked child of a process with gRPC's threads can crash before exec.
        identity = [] if self._uid is None else ["setpriv", f"--reuid={self._uid}", f"--regid={self._uid}",
                                                 "--clear-groups", "--"]
        return await asyncio.create_subprocess_exec(
            *identity,
            *self._prlimit(),
            *command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # only bwrap writes here (the runner sends fd 2 to /dev/null)
            cwd=self.workdir,
            env={},
            start_new_session=True,
            limit=4 * self._limits.output_bytes + 65536,
        )

    async def run(self, code: str) -> dict:
        """Execute ``code``; return the runner's reply, or {"failure": kind, "message": ...} if the session died."""
        restarted = False
        if self._process is None or self._process.returncode is not None:
            restarted = self._starts > 0
            self._process = await self._start()
        process = self._process
        try:
            process.stdin.write((json.dumps({"code": code}) + "\n").encode())
            await process.stdin.drain()
            line = await asyncio.wait_for(process.stdout.readline(), self._limits.wall_timeout_s)
        except TimeoutError:
            await self._kill()
            return {"failure": "timeout", "message": f"the code ran longer than {self._limits.wall_timeout_s:g} s "
                    "and was stopped; the session restarts (its variables are gone)"}
        except (ConnectionError, ValueError, asyncio.LimitOverrunError):
            detail = await self._stderr_tail(process)
            await self._kill()
            return {"failure": "resource_limit", "message": f"the session broke its output channel and was restarted{detail}"}
        if not line:
            code_ = await process.wait()
            reason = _describe_exit(code_) + await self._stderr_tail(process)
            self._process = None
            return {"failure": "resource_limit", "message": f"the session died ({reason}); it restarts with "
                    "its variables gone"}
        reply = json.loads(line)
        reply["restarted"] = restarted
        return reply

    @staticmethod
    async def _stderr_tail(process: asyncio.subprocess.Process) -> str:
        try:
            text = await asyncio.wait_for(process.stderr.read(2000), 1.0)
        except TimeoutError:
            return ""
        return f": {text.decode(errors='replace').strip()}" if text.strip() else ""

    async def _kill(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await process.wait()

    async def close(self) -> None:
        await self._kill()
        await asyncio.to_thread(shutil.rmtree, self.workdir, True)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hints = {"SIGXCPU": "CPU time limit", "SIGKILL": "killed, e.g. out of memory", "SIGXFSZ": "file size limit"}
        return f"{name}: {hints.get(name, 'signal')}"
    return f"exit code {returncode}"
