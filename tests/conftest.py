"""What every suite shares: how `make test` splits the tests between its two pytest-xdist workers."""

from __future__ import annotations

from typing import Any

#: Folders whose tests hold the most memory (vLLM engines, TRL and verl trainers): two of those at once would not fit
#: CI's machine (24 GiB), so these folders share one worker and run one after the other.
_ONE_AT_A_TIME = frozenset({"contract", "vllm", "multimodal", "integrations", "train", "sglang"})


def work_unit(nodeid: str) -> str:
    """The tests that must run in one worker: a whole folder, since its conftest starts its servers, engines or
    cluster once per worker (tests/cluster's network namespaces could not exist twice at all)."""
    parts = nodeid.split("::", 1)[0].split("/")
    folder = parts[1] if len(parts) > 2 else parts[-1]
    return "engines and trainers" if folder in _ONE_AT_A_TIME else folder


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """xdist's scope scheduling, with our units (its `xdist_group` marks are lost on pytest 9.2's node ids)."""
    from xdist.scheduler import LoadScopeScheduling

    class FolderScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return FolderScheduling(config, log)
