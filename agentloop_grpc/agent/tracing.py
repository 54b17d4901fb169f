"""Turn tracing: one JSON line per turn per trajectory (tokens, text, timings, server, tool calls).

Enabled by giving the loop context a tracer; ``JsonlTracer`` appends to a file. Lines are written whole, one
``write`` each, so concurrent loops in one process never interleave inside a line.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Protocol


class Tracer(Protocol):
    def record(self, event: dict[str, Any]) -> None: ...


class JsonlTracer:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def record(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
