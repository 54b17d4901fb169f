"""What every suite shares: how `make test` splits the tests between its two pytest-xdist workers, and that a test
closes every asyncio HTTP client it opens."""

from __future__ import annotations

import importlib
import os
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

# torch's OpenMP threads read GOMP_SPINCOUNT once, when torch loads, and collection imports torch with the first
# test module that needs it (tests/agent), long before tests/embedded's conftest: without a bound here, every
# in-process engine and trainer spin-waits against the other worker (agentloop_grpc/engine_adapters/embedded/NOTES.md).
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

#: Folders whose tests hold the most memory (vLLM engines, TRL and verl trainers): two of those at once would not fit
#: CI's machine (24 GiB), so these folders share one worker and run one after the other.
_ONE_AT_A_TIME = frozenset({"contract", "vllm", "multimodal", "integrations", "train", "sglang"})


def work_unit(nodeid: str) -> str:
    """The tests that must run in one worker: a whole folder, since its conftest starts its servers, engines or
    cluster once per worker (tests/cluster's network namespaces could not exist twice at all)."""
    parts = nodeid.split("::", 1)[0].split("/")
    folder = parts[1] if len(parts) > 2 else parts[-1]
    return "engines and trainers" if folder in _ONE_AT_A_TIME else folder


@pytest.hookimpl(optionalhook=True)  # a run without xdist (bench/gpu_check.py's, plugins named) has no such hook
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """xdist's scope scheduling, with our units (its `xdist_group` marks are lost on pytest 9.2's node ids)."""
    from xdist.scheduler import LoadScopeScheduling

    class FolderScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return FolderScheduling(config, log)


@pytest.fixture(autouse=True)
def async_http_clients_are_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fails a test that leaves an asyncio HTTP client open (``httpx.AsyncClient``, and ``httpx2``'s, which the
    openai and anthropic SDKs' async clients are). The garbage collector closes such a client's sockets under
    transports still registered with the event loop; the SDK's finalizer then schedules ``aclose()``, whose abort
    unregisters whatever file now has that number: once gRPC's completion-queue socket, after which the test
    process's gRPC servers never answered."""
    opened: weakref.WeakSet[Any] = weakref.WeakSet()
    for name in ("httpx", "httpx2"):
        try:
            client_class = importlib.import_module(name).AsyncClient
        except ImportError:  # a machine without the gateway's clients runs no test that opens one
            continue
        monkeypatch.setattr(client_class, "__init__", _tracked(client_class.__init__, opened))
    yield
    left = [client for client in opened if not client.is_closed]
    assert not left, f"{len(left)} asyncio HTTP client(s) left open: close each (async with, or await .close())"


def _tracked(init: Any, opened: weakref.WeakSet[Any]) -> Any:
    def tracked(client: Any, *args: Any, **kwargs: Any) -> None:
        init(client, *args, **kwargs)
        opened.add(client)

    return tracked
