"""Worker processes for sync function tools: each call runs out of the server's process, bounded in time.

In a thread of the server, one C operation holding the GIL (a huge integer power, a regex that backtracks without
end) froze the event loop: Health and every other trajectory's calls stopped answering until it finished. In a
worker process such a call burns one core and nothing else; past its time limit the worker is killed and the model
reads a TIMEOUT tool error. Workers start on demand (a fresh interpreter, never a fork of a process with gRPC's
threads), stay for the next call, and at most ``size`` run at once; a call whose caller gives up (cancelled) kills
its worker, so abandoned work stops too.

Wire: a length-prefixed pickle each way over the worker's stdin and stdout; what the function prints goes to the
server's stderr.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import pickle
import signal
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from .result import ToolErrorKind, ToolResult, exception_result, timeout_result, to_result

_HEADER = struct.Struct(">Q")
_PR_SET_PDEATHSIG = 1


def importable(function: Callable[..., Any]) -> bool:
    """Whether ``function`` crosses to another process by name (it is defined at a module's top level)."""
    try:
        return pickle.loads(pickle.dumps(function)) is function
    except (pickle.PicklingError, AttributeError, TypeError):
        return False


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def call(self, request: bytes) -> ToolResult:
        self.process.stdin.write(_HEADER.pack(len(request)) + request)
        await self.process.stdin.drain()
        (size,) = _HEADER.unpack(await self.process.stdout.readexactly(_HEADER.size))
        return pickle.loads(await self.process.stdout.readexactly(size))

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.kill()
        return await self.process.wait()


class WorkerPool:
    """Runs one sync function's calls in up to ``size`` worker processes, each call within ``timeout_s``."""

    def __init__(self, function: Callable[..., Any], name: str, size: int, timeout_s: float) -> None:
        if not importable(function):
            raise TypeError(f"{name}: a sync function tool runs in a worker process, so it must be defined at a "
                            "module's top level (or be async)")
        if size < 1 or timeout_s <= 0:
            raise ValueError(f"{name}: workers >= 1 and timeout_s > 0 required")
        self._function, self._name, self._size, self._timeout = function, name, size, timeout_s
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(size)

    async def call(self, arguments: dict[str, Any]) -> ToolResult:
        request = pickle.dumps((self._function, arguments))
        self._bind_loop()
        async with self._slots:
            worker = self._idle.pop() if self._idle else await self._start()
            self._busy.add(worker)
            try:
                result = await asyncio.wait_for(worker.call(request), self._timeout)
            except TimeoutError:
                await worker.stop()
                return timeout_result(self._name, self._timeout)
            except (asyncio.IncompleteReadError, ConnectionError):
                returncode = await worker.stop()
                return ToolResult.error(ToolErrorKind.RESOURCE_LIMIT,
                                        f"{self._name} stopped: its worker process died ({_describe(returncode)})")
            except BaseException:  # cancelled: nobody waits for this call any more, so its work stops
                await worker.stop()
                raise
            finally:
                self._busy.discard(worker)
            self._idle.append(worker)
            return result

    def _bind_loop(self) -> None:
        """Workers' pipes belong to the event loop that started them: one loop at a time, until ``close``."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._slots = loop, asyncio.Semaphore(self._size)
        elif loop is not self._loop:
            raise RuntimeError(f"{self._name}: its workers serve another event loop (close the tool first)")

    async def _start(self) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from agentloop_grpc.tools.workers import serve; serve()", str(os.getpid()),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            start_new_session=True,  # a Ctrl-C meant for the server is the server's to handle
        )
        return _Worker(process)

    async def close(self) -> None:
        """Stop every worker (a call still running gets a died-worker result)."""
        workers, self._idle = [*self._idle, *self._busy], []
        for worker in workers:
            await worker.stop()
        self._loop = None


def _describe(returncode: int) -> str:
    return f"signal {signal.Signals(-returncode).name}" if returncode < 0 else f"exit code {returncode}"


def serve() -> None:
    """A worker's main loop: read (function, arguments), answer its ToolResult, until stdin closes."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the server killed hard takes its workers along
    if os.getppid() != int(sys.argv[1]):  # it died before the line above
        return
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a function's prints must not corrupt the replies
    requests = sys.stdin.buffer
    while header := requests.read(_HEADER.size):
        (size,) = _HEADER.unpack(header)
        request = requests.read(size)
        try:
            function, arguments = pickle.loads(request)
            reply = pickle.dumps(to_result(function(**arguments)))
        except Exception as error:  # noqa: BLE001 - the tool's failure is the model's to read
            reply = pickle.dumps(exception_result(error))
        replies.write(_HEADER.pack(len(reply)) + reply)
        replies.flush()
