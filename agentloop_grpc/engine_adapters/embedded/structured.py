"""Structured output through xgrammar: compile a constraint once, then one matcher per request.

xgrammar compiles JSON schemas, regexes and EBNF grammars against the tokenizer's vocabulary; a ``GrammarMatcher``
then yields, at each step, the bitmask of tokens that keep the output inside the language. The engine turns the
bitmask into a boolean row applied to the logits before sampling and feeds every sampled token back
(``accept``). When the grammar is complete the matcher only allows the stop token (eos); accepting it terminates
the matcher and the request ends with STOP.

Compiling runs in processes of its own (``grammar_worker.py``), because xgrammar's compile cannot be interrupted
and a small grammar can keep it busy for minutes: a compilation ends when it is done, when its time bound passes
(INVALID_ARGUMENT), or when no request waits for it any more (cancelled, deadline, Abort), which kills its process.
A process starts when a compilation first needs one (up to ``grammar_workers``), not with the engine. Requests for
the same constraint share one compilation, and what compiled is cached here, bounded in bytes.

JSON is compiled without free whitespace (``any_whitespace=False``): with it, a small model spends its tokens
on blanks and rarely closes strings.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.types import StructuredOutput

from .config import EmbeddedEngineConfig
from .grammar_worker import LENGTH, OK, frame

_WORKER = Path(__file__).with_name("grammar_worker.py")


class _CompilerProcess:
    """One grammar_worker.py process; it compiles one constraint at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @classmethod
    async def start(cls, info_json: bytes, threads: int, max_bytes: int) -> _CompilerProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(_WORKER), str(threads), str(max_bytes),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        started = cls(process)
        try:
            process.stdin.write(frame(info_json))
            if await process.stdout.read(1) != OK:  # nothing: it died importing xgrammar
                raise RuntimeError(f"the grammar compiler process did not start (exit code {await process.wait()})")
        except BaseException:  # cancelled while it loads, too: no process outlives its slot
            started.kill()
            raise
        return started

    async def compile(self, constraint: StructuredOutput) -> tuple[bool, bytes]:
        """Whether it compiled, and the compiled grammar as xgrammar's JSON (or the reason it did not)."""
        self._process.stdin.write(frame(json.dumps([constraint.kind, constraint.spec]).encode()))
        await self._process.stdin.drain()
        status = await self._process.stdout.readexactly(1)
        (size,) = LENGTH.unpack(await self._process.stdout.readexactly(LENGTH.size))
        return status == OK, await self._process.stdout.readexactly(size)

    @property
    def pid(self) -> int:
        return self._process.pid

    def kill(self) -> None:
        if self._process.returncode is None:
            self._process.kill()

    async def wait(self) -> int:
        """The exit code, once the process ended."""
        return await self._process.wait()

    async def close(self) -> None:
        self.kill()
        await self.wait()


@dataclass(slots=True)
class _Pending:
    """A compilation in progress and how many requests wait for it."""

    task: asyncio.Task[xgr.CompiledGrammar]
    waiters: int = 0


class GrammarCompiler:
    """Compiles constraints against one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, config: EmbeddedEngineConfig) -> None:
        self.vocab_size = vocab_size
        self._info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._info_json = self._info.serialize_json().encode()
        self._threads = max(1, config.threads // config.grammar_workers)
        self._timeout_s = config.grammar_compile_timeout_s
        self._max_bytes = config.grammar_max_bytes
        self._cache_limit = config.grammar_cache_bytes
        # a compilation holds one of grammar_workers slots and runs in an idle process, or starts one when none is
        # idle: each loads xgrammar, which imports torch and transformers (seconds of CPU, hundreds of MB), so an
        # engine never asked for a constraint runs none, and a process once started is reused before another starts
        self._slots = asyncio.Semaphore(config.grammar_workers)
        self._idle: list[_CompilerProcess] = []
        self._busy: set[_CompilerProcess] = set()
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._cache: OrderedDict[tuple[str, str], xgr.CompiledGrammar] = OrderedDict()
        self._cached_bytes = 0

    async def release(self) -> None:
        """Stop the idle processes, whose memory Sleep gives back; the next compilation starts a new one."""
        idle, self._idle = self._idle, []
        for process in idle:
            await process.close()

    async def close(self) -> None:
        """Stop every process; compilations in progress fail."""
        for pending in list(self._pending.values()):
            pending.task.cancel()
        for process in [*self._idle, *self._busy]:
            await process.close()
        self._idle = []

    def process_ids(self) -> set[int]:
        """Pids of its compiler processes, idle or compiling (a process killed may not have exited yet)."""
        return {process.pid for process in [*self._idle, *self._busy]}

    async def compile(self, constraint: StructuredOutput) -> xgr.CompiledGrammar:
        """``constraint`` compiled; InvalidRequestError names the field when it does not compile (or not in time).

        Cancelling the caller stops the compilation once no other request waits for the same constraint."""
        key = (constraint.kind, constraint.spec)
        if (compiled := self._cache.get(key)) is not None:
            self._cache.move_to_end(key)
            return compiled
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(asyncio.create_task(self._compile(constraint)))
        pending.waiters += 1
        try:
            return await asyncio.shield(pending.task)
        finally:
            pending.waiters -= 1
            if not pending.waiters:
                del self._pending[key]
                pending.task.cancel()  # nobody waits any more: kill the compilation (nothing if it ended)

    async def _start_process(self) -> _CompilerProcess:
        return await _CompilerProcess.start(self._info_json, self._threads, self._max_bytes)

    async def _compile(self, constraint: StructuredOutput) -> xgr.CompiledGrammar:
        field = f"structured_output.{constraint.kind}"
        async with self._slots:
            process = self._idle.pop() if self._idle else None
            try:
                process = process or await self._start_process()
                self._busy.add(process)
                async with asyncio.timeout(self._timeout_s):
                    ok, payload = await process.compile(constraint)
            except TimeoutError as error:
                self._discard(process)
                message = f"{field} did not compile within {self._timeout_s:g} s (grammar_compile_timeout_s)"
                raise InvalidRequestError(message) from error
            except asyncio.IncompleteReadError as error:  # the process died: a crash or the kernel's OOM killer
                self._discard(process)
                code = await process.wait()
                raise InvalidRequestError(f"{field}: the grammar compiler process ended (exit code {code})") from error
            except BaseException:  # cancelled (nobody waits any more), or the process was gone before the job
                self._discard(process)
                raise
            self._busy.discard(process)
            self._idle.append(process)
        if not ok:
            raise InvalidRequestError(f"{field} {payload.decode(errors='replace')}")
        # bounded work (grammar_max_bytes) in xgrammar's own code, so a thread, not the engine's torch worker
        compiled = await asyncio.to_thread(xgr.CompiledGrammar.deserialize_json, payload.decode(), self._info)
        self._remember((constraint.kind, constraint.spec), compiled)
        return compiled

    def _discard(self, process: _CompilerProcess | None) -> None:
        """Kill ``process`` (whatever it compiles), if one was started: its slot is then free for a new one."""
        if process is not None:
            self._busy.discard(process)
            process.kill()

    def _remember(self, key: tuple[str, str], compiled: xgr.CompiledGrammar) -> None:
        """Cache ``compiled``, dropping the least recently used entries beyond the byte bound."""
        size = compiled.memory_size_bytes
        if size > self._cache_limit:
            return
        self._cache[key] = compiled
        self._cached_bytes += size
        while self._cached_bytes > self._cache_limit:
            _, dropped = self._cache.popitem(last=False)
            self._cached_bytes -= dropped.memory_size_bytes


class StructuredState:
    """One request's position in its grammar."""

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._vocab_size = vocab_size

    def allowed(self) -> torch.Tensor:
        """Boolean row: the tokens the grammar allows next."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        row = torch.zeros(1, self._vocab_size, dtype=torch.float32)
        xgr.apply_token_bitmask_inplace(row, self._bitmask, vocab_size=self._vocab_size)
        return row[0] == 0.0

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise RuntimeError(f"the grammar matcher rejected token {token}, which its own bitmask allowed")

    @property
    def terminated(self) -> bool:
        return self._matcher.is_terminated()
