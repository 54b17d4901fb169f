"""The embedded engine's grammar compiler process: compiles one structured-output constraint at a time.

xgrammar's compile cannot be interrupted, and a grammar of a few dozen bytes can keep it busy for minutes; in a
process of its own, a compilation whose request was cancelled, aborted or ran out of time is stopped by killing
the process (``structured.py`` does that). The engine runs this file by its path, so the process imports xgrammar
and the standard library only, not this package (whose ``__init__`` loads transformers).

Protocol, in frames of an 8-byte little-endian length and that many bytes. On stdin: the TokenizerInfo as
xgrammar's JSON, then one job per frame, ``[kind, spec]`` as JSON. On stdout (the process's own writes go to
stderr): one OK byte once ready, then per job one status byte (OK or FAILED) and a frame, the compiled grammar as
xgrammar's JSON or the reason it failed. JSON is compiled without free whitespace (see ``structured.py``).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import xgrammar as xgr

LENGTH = struct.Struct("<Q")
OK, FAILED = b"\x00", b"\x01"


def frame(data: bytes) -> bytes:
    return LENGTH.pack(len(data)) + data


def _read(stream: BinaryIO) -> bytes | None:
    """The next frame; None at the end of the stream (the engine closed it or exited)."""
    header = stream.read(LENGTH.size)
    if len(header) < LENGTH.size:
        return None
    (size,) = LENGTH.unpack(header)
    return stream.read(size)


def _compile(compiler: xgr.GrammarCompiler, kind: str, spec: str) -> xgr.CompiledGrammar:
    if kind == "json_schema":
        return compiler.compile_json_schema(spec, any_whitespace=False)
    if kind == "regex":
        return compiler.compile_regex(spec)
    return compiler.compile_grammar(spec)


def _answer(compiler: xgr.GrammarCompiler, job: bytes, max_bytes: int) -> tuple[bytes, bytes]:
    kind, spec = json.loads(job)
    try:
        compiled = _compile(compiler, kind, spec)
    except (RuntimeError, ValueError) as error:
        return FAILED, f"does not compile: {error}".encode()
    if compiled.memory_size_bytes > max_bytes:  # the engine deserializes what comes back, where it cannot be stopped
        reason = f"compiles to {compiled.memory_size_bytes} bytes of token masks; at most {max_bytes} are allowed"
        return FAILED, reason.encode()
    return OK, compiled.serialize_json().encode()


def main() -> None:
    threads, max_bytes = int(sys.argv[1]), int(sys.argv[2])
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever else writes to stdout lands on stderr, never inside a reply
    import xgrammar as xgr  # after the redirection: nothing it prints can corrupt a reply

    jobs = sys.stdin.buffer
    info = xgr.TokenizerInfo.deserialize_json(_read(jobs).decode())
    compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)  # the engine caches results
    replies.write(OK)  # ready: a job's time bound starts with the job, not with this process's imports
    replies.flush()
    while (job := _read(jobs)) is not None:
        status, payload = _answer(compiler, job, max_bytes)
        replies.write(status + frame(payload))
        replies.flush()


if __name__ == "__main__":
    main()
