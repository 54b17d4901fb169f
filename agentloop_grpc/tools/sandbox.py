"""A sandboxed Python session: one process per tool instance, variables kept between calls.

Isolation, in layers (each one tested by trying the escape):
  - bubblewrap (``bwrap``, its command line from ``common/jail.py``): new mount, PID, IPC, UTS and network
    namespaces, no capabilities; the filesystem is /usr read-only
    plus a private working folder /work and a /tmp, both tmpfs of the session's own with a total size quota
    (``work_bytes``, ``tmp_bytes``: host memory, gone with the session, so nothing is left on the host's disk);
    no network at all (a loopback of its own, nothing on it);
  - an unprivileged uid per instance (when the server runs as root), so RLIMIT_NPROC bounds a fork bomb;
  - rlimits (set by util-linux's prlimit, which execs the sandbox): address space (memory), CPU seconds,
    processes, file size, open files;
  - a wall-clock timeout per call (the session is killed and restarted; the model is told its variables are gone);
  - bounded output: the runner keeps at most ``output_bytes`` of what the code prints (UTF-8 bytes, so the reply
    is bounded whatever the characters) and of a traceback;
  - a reply channel the code cannot desynchronise: the runner answers each request with one frame, a header
    "<nonce> <length>" then that many bytes of JSON, and the nonce is fresh per call. The code runs in the
    runner's process, so it can write to the channel and can read the nonce of the call it runs in (the
    runner's variables are its own), so it can forge a well-formed reply to that call, or, from a thread it leaves
    running, to a later call of the same session. What holds: a frame only ever answers a call of the session that
    wrote it (each session has its own pipes), stays within the reply's bound and shape (so it tells the model
    nothing the code could not have printed), and is read once; anything else the code writes (bytes without end,
    an overlong header, another call's nonce, a length past the bound, the real reply a forgery left behind)
    ends the call being read at once in a tool error with the session restarted, never a hang and never a later
    call answered with an earlier call's reply. Hiding the nonce would not change this: code in a process can
    read all of its memory;
  - a clean environment: nothing of the server's environment reaches the session (bwrap itself starts with an
    empty one, so not even /proc/1/environ shows it).
Where bwrap cannot run, ``probe_isolation()`` says so and the python tool's description carries that warning: the
session then still has rlimits, a uid and a timeout, a host folder of its own (mode 0700, owned by its uid when the
server runs as root) as working directory, HOME and TMPDIR, but shares the host's network and filesystem view.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agentloop_grpc.common.jail import JailSpec, Rlimits, Tmpfs, probe

log = logging.getLogger(__name__)

_RUNNER = r"""
import ast, io, json, os, sys, traceback
LIMIT = int(sys.argv[1])
channel = os.fdopen(os.dup(1), "wb")
requests = os.fdopen(os.dup(0), "r")
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)

def utf8(text):
    return text.encode("utf-8", "replace")

def bounded(text):
    return utf8(text[:LIMIT])[:LIMIT].decode("utf-8", "ignore")

class Bounded(io.TextIOBase):
    def __init__(self):
        self.parts, self.kept, self.size = [], 0, 0
    def writable(self):
        return True
    def write(self, text):
        room = LIMIT - self.kept
        if room > 0:
            self.parts.append(utf8(text[:room])[:room])
            self.kept += len(self.parts[-1])
        self.size += len(text) if text.isascii() else len(utf8(text))
        return len(text)
    def value(self):
        return b"".join(self.parts).decode("utf-8", "ignore")

namespace = {"__name__": "__main__"}
MAIN = os.getpid()
for line in requests:
    request = json.loads(line)
    out = Bounded()
    sys.stdout = sys.stderr = out
    error = None
    try:
        tree = ast.parse(request["code"], "<cell>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
            if value is not None:
                print(repr(value))
    except BaseException as exc:
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        error = bounded("".join(lines[-6:]))
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    if os.getpid() != MAIN:  # a process the code forked: it must not answer for the session
        os._exit(0)
    reply = json.dumps({"output": out.value(), "error": error, "truncated": out.size > out.kept,
                        "printed": out.size}, ensure_ascii=False).encode()
    channel.write(b"%s %d\n" % (request["nonce"].encode(), len(reply)) + reply)
    channel.flush()
"""
#: The reply frame's header: "<nonce> <payload bytes>\n".
_HEADER_BYTES = 128


class _Malformed(Exception):
    """The reply channel held something other than the runner's reply to this call."""


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
    tmp_bytes: int = 64 * 1024 * 1024
    work_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.wall_timeout_s <= 0 or self.cpu_seconds < 1 or self.memory_bytes < 64 * 1024 * 1024:
            raise ValueError("wall_timeout_s > 0, cpu_seconds >= 1 and memory_bytes >= 64 MiB required")
        if self.output_bytes < 1 or self.max_processes < 1 or self.file_bytes < 1 or self.open_files < 8:
            raise ValueError("output_bytes, max_processes and file_bytes >= 1, open_files >= 8 required")
        if self.tmp_bytes < 1024 * 1024 or self.work_bytes < 1024 * 1024:
            raise ValueError("tmp_bytes and work_bytes >= 1 MiB required")


def _interpreter() -> str:
    """A Python readable by any uid (the system one), so the unprivileged session can start it."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return os.path.realpath(shutil.which("python3") or "python3")


def jail_spec(interpreter: str, limits: SandboxLimits) -> JailSpec:
    """The session's jail (``common/jail.py``): /usr read-only (and the interpreter's prefix when it lies
    elsewhere), private tmpfs /tmp and /work of the limits' sizes, /work the home and working directory, no network,
    an environment of HOME and PATH only."""
    prefix = str(Path(interpreter).resolve().parent.parent)
    return JailSpec(
        read_only=() if prefix.startswith("/usr") else (prefix,),
        tmpfs=(Tmpfs("/tmp", limits.tmp_bytes), Tmpfs("/work", limits.work_bytes)),
        chdir="/work",
        env={"HOME": "/work", "PATH": "/usr/bin:/bin"},
    )


def probe_isolation() -> str | None:
    """None when bwrap isolates here; otherwise why it cannot (said loudly by the server)."""
    return probe(jail_spec(_interpreter(), SandboxLimits()), (_interpreter(), "-c", "pass"))


class PythonSession:
    """One sandboxed interpreter; ``run`` executes code in its persistent namespace."""

    def __init__(self, limits: SandboxLimits, uids: Iterator[int] | None, workdir: Path | None) -> None:
        """``uids`` yields a fresh unprivileged uid for every (re)start (None: keep ours, when not root), so
        processes of a killed session still exiting cannot eat the new one's process limit. ``workdir`` is None
        for a session bwrap isolates (its folders are its own tmpfs), else the host folder an unisolated session
        works in, removed by ``close``."""
        self._limits = limits
        self._uids = uids
        self._uid: int | None = None
        self.workdir = workdir
        self._process: asyncio.subprocess.Process | None = None
        self._starts = 0

    def _prlimit(self) -> list[str]:
        """rlimits through util-linux's prlimit, which execs the sandbox with them (``Rlimits``)."""
        limits = self._limits
        return Rlimits(memory_bytes=limits.memory_bytes, cpu_seconds=limits.cpu_seconds,
                       processes=limits.max_processes, file_bytes=limits.file_bytes,
                       open_files=limits.open_files).argv()

    async def _start(self) -> asyncio.subprocess.Process:
        self._starts += 1
        if self._uids is not None:
            self._uid = next(self._uids)
            if self.workdir is not None:
                os.chown(self.workdir, self._uid, self._uid)
                for entry in self.workdir.rglob("*"):
                    os.lchown(entry, self._uid, self._uid)
        interpreter = _interpreter()
        command = [interpreter, "-I", "-S", "-c", _RUNNER, str(self._limits.output_bytes)]
        if self.workdir is None:
            command = jail_spec(interpreter, self._limits).argv(command)
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
            cwd=self.workdir or "/",
            # an unisolated session's folder is its home and temporary folder too, so what code writes there by
            # default (tempfile, ~) is its own; the host's /tmp stays shared (the description warns)
            env={} if self.workdir is None else {"HOME": str(self.workdir), "TMPDIR": str(self.workdir)},
            start_new_session=True,
            limit=_HEADER_BYTES,  # bounds a header line; a payload is read by its announced length
        )

    async def run(self, code: str) -> dict:
        """Execute ``code``; return the runner's reply, or {"failure": kind, "message": ...} if the session died,
        timed out or answered out of turn."""
        restarted = False
        if self._process is None or self._process.returncode is not None:
            restarted = self._starts > 0
            self._process = await self._start()
        process = self._process
        nonce = secrets.token_hex(16)
        try:
            async with asyncio.timeout(self._limits.wall_timeout_s):
                process.stdin.write((json.dumps({"code": code, "nonce": nonce}) + "\n").encode())
                await process.stdin.drain()
                reply = await self._reply(process, nonce)
        except TimeoutError:
            await self._kill()
            return {"failure": "timeout", "message": f"the code ran longer than {self._limits.wall_timeout_s:g} s "
                    "and was stopped; the session restarts (its variables and files are gone)"}
        except _Malformed as problem:
            await self._kill()
            return {"failure": "malformed", "message": f"the session's reply channel held {problem} (did the code "
                    "write to a file descriptor it did not open?); the session restarts (its variables and files "
                    "are gone)"}
        except (ConnectionError, asyncio.IncompleteReadError):
            reason = _describe_exit(await self._kill()) + await self._stderr_tail(process)
            return {"failure": "resource_limit", "message": f"the session died ({reason}); it restarts with "
                    "its variables and files gone"}
        except asyncio.CancelledError:  # the caller gave up: this call's reply must not answer the next one
            await self._kill()
            raise
        reply["restarted"] = restarted
        return reply

    async def _reply(self, process: asyncio.subprocess.Process, nonce: str) -> dict:
        """The runner's framed reply to the request carrying ``nonce``; anything else is _Malformed."""
        try:
            header = await process.stdout.readuntil(b"\n")
        except asyncio.IncompleteReadError as error:
            if error.partial:
                raise _Malformed(f"{len(error.partial)} bytes without a reply's header") from None
            raise
        except asyncio.LimitOverrunError:
            raise _Malformed(f"a header longer than {_HEADER_BYTES} bytes") from None
        parts = header.split()
        bound = 12 * self._limits.output_bytes + 1024  # two bounded texts, each at most 6x when JSON-escaped
        if len(parts) != 2 or parts[0] != nonce.encode() or not parts[1].isdigit() or int(parts[1]) > bound:
            raise _Malformed("a header that is not this call's")
        try:
            reply = json.loads(await process.stdout.readexactly(int(parts[1])))
        except ValueError:
            raise _Malformed("a reply that is not JSON") from None
        if not (isinstance(reply, dict) and isinstance(reply.get("output"), str)
                and isinstance(reply.get("error"), str | None) and isinstance(reply.get("truncated"), bool)
                and isinstance(reply.get("printed"), int)):
            raise _Malformed("a reply of the wrong shape")
        return reply

    @staticmethod
    async def _stderr_tail(process: asyncio.subprocess.Process) -> str:
        try:
            text = await asyncio.wait_for(process.stderr.read(2000), 1.0)
        except TimeoutError:
            return ""
        return f": {text.decode(errors='replace').strip()}" if text.strip() else ""

    async def _kill(self) -> int | None:
        """Kill the session; its exit status (None if there was none to kill)."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.returncode is None:  # once reaped, its pid may belong to someone else
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        # asyncio sees the process end only once its pipes are closed: read them to their end, a paused reader
        # (a reply channel flooded by the code) would otherwise never see it
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.gather(process.stdout.read(), process.wait())
        return process.returncode

    async def close(self) -> None:
        await self._kill()
        if self.workdir is not None:
            await asyncio.to_thread(shutil.rmtree, self.workdir, True)


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "exit status unknown"
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hints = {"SIGXCPU": "CPU time limit", "SIGKILL": "killed, e.g. out of memory", "SIGXFSZ": "file size limit"}
        return f"{name}: {hints.get(name, 'signal')}"
    return f"exit code {returncode}"
