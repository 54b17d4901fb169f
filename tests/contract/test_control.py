"""Contract: EngineControl (server info, sleep/wake with health, pause modes, weight updates, cache flush)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2

from agentloop_grpc.v1 import engine_pb2, generation_pb2

from .target import ContractTarget, StreamWatcher, collect, generate_error, request

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICES = ("", "agentloop.v1.TokenGenerate", "agentloop.v1.EngineControl")


async def test_server_info_describes_engine(engine: ContractTarget) -> None:
    info = await engine.info()
    assert info.engine_kind == engine.name
    assert info.model_id and info.tokenizer_fingerprint and info.engine_version
    assert info.vocab_size > max(engine.prompt)
    assert info.max_model_len > len(engine.prompt)
    assert info.eos_token_ids
    assert 0 <= info.dp_rank < info.dp_size and info.tp_size >= 1
    assert info.state == engine_pb2.ENGINE_STATE_RUNNING


async def test_health_serving_on_every_service(engine: ContractTarget) -> None:
    for service in SERVICES:
        assert await engine.health_status(service) == SERVING


@pytest.mark.parametrize("level", [engine_pb2.SLEEP_LEVEL_KV_CACHE, engine_pb2.SLEEP_LEVEL_KV_CACHE_AND_WEIGHTS])
async def test_sleep_refuses_generate_and_wake_restores(engine: ContractTarget, level: int) -> None:
    info = await engine.info()
    slept = await engine.control.Sleep(engine_pb2.SleepRequest(level=level), timeout=60)
    assert slept.state == engine_pb2.ENGINE_STATE_SLEEPING
    assert slept.memory_released == info.sleep_releases_memory
    assert (await engine.info()).state == engine_pb2.ENGINE_STATE_SLEEPING
    for service in SERVICES:
        assert await engine.health_status(service) == NOT_SERVING
    error = await generate_error(engine, request(engine, max_new_tokens=2))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    woke = await engine.control.WakeUp(engine_pb2.WakeUpRequest(), timeout=120)
    assert woke.state == engine_pb2.ENGINE_STATE_RUNNING
    assert await engine.health_status() == SERVING
    result = await collect(engine, request(engine, max_new_tokens=3, ignore_eos=True))
    assert len(result.tokens) == 3


async def test_wake_up_by_tags_serves_only_when_everything_is_back(engine: ContractTarget) -> None:
    await engine.control.Sleep(engine_pb2.SleepRequest(level=engine_pb2.SLEEP_LEVEL_KV_CACHE_AND_WEIGHTS), timeout=60)
    partial = await engine.control.WakeUp(engine_pb2.WakeUpRequest(tags=[engine_pb2.WAKE_UP_TAG_WEIGHTS]), timeout=120)
    assert partial.state == engine_pb2.ENGINE_STATE_SLEEPING
    assert await engine.health_status() == NOT_SERVING
    full = await engine.control.WakeUp(engine_pb2.WakeUpRequest(tags=[engine_pb2.WAKE_UP_TAG_KV_CACHE]), timeout=120)
    assert full.state == engine_pb2.ENGINE_STATE_RUNNING
    assert await engine.health_status() == SERVING


async def test_wake_up_when_awake_is_a_no_op(engine: ContractTarget) -> None:
    woke = await engine.control.WakeUp(engine_pb2.WakeUpRequest(), timeout=60)
    assert woke.state == engine_pb2.ENGINE_STATE_RUNNING


async def test_sleep_with_requests_in_flight_is_refused(engine: ContractTarget) -> None:
    call = engine.generate.Generate(request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True), timeout=120)
    await call.read()
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await engine.control.Sleep(engine_pb2.SleepRequest(level=engine_pb2.SLEEP_LEVEL_KV_CACHE), timeout=30)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "in flight" in error.value.details()
    call.cancel()


@pytest.mark.parametrize(
    ("call_name", "message"),
    [
        ("Sleep", engine_pb2.SleepRequest()),
        ("Pause", engine_pb2.PauseRequest()),
        ("WakeUp", engine_pb2.WakeUpRequest(tags=[engine_pb2.WAKE_UP_TAG_UNSPECIFIED])),
    ],
)
async def test_unspecified_enums_are_invalid(engine: ContractTarget, call_name: str, message) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await getattr(engine.control, call_name)(message, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await engine.info()).state == engine_pb2.ENGINE_STATE_RUNNING


async def test_pause_abort_aborts_in_flight_and_holds_new_requests(engine: ContractTarget) -> None:
    running = StreamWatcher(engine, request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True))
    await running.first_tokens()
    paused = await engine.control.Pause(engine_pb2.PauseRequest(mode=engine_pb2.PAUSE_MODE_ABORT), timeout=30)
    assert paused.aborted_requests == 1 and paused.state == engine_pb2.ENGINE_STATE_PAUSED
    aborted = await running.result()
    assert aborted.complete.finish_reason == generation_pb2.FINISH_REASON_ABORT
    assert 0 < len(aborted.tokens) < engine.long_tokens
    assert await engine.health_status() == SERVING  # paused is transient: requests wait, they are not refused
    held = StreamWatcher(engine, request(engine, max_new_tokens=4, ignore_eos=True))
    await asyncio.sleep(0.5)
    assert held.token_count == 0
    await engine.control.Resume(engine_pb2.ResumeRequest(), timeout=30)
    resumed = await held.result()
    assert len(resumed.tokens) == 4
    assert resumed.complete.finish_reason == generation_pb2.FINISH_REASON_LENGTH


async def test_pause_keep_holds_and_resume_continues_the_same_stream(engine: ContractTarget) -> None:
    def seeded():
        return request(engine, max_new_tokens=engine.long_tokens // 4, ignore_eos=True, seed=77)

    reference = await collect(engine, seeded())
    kept = StreamWatcher(engine, seeded())
    await kept.first_tokens()
    paused = await engine.control.Pause(engine_pb2.PauseRequest(mode=engine_pb2.PAUSE_MODE_KEEP), timeout=30)
    assert paused.kept_requests == 1
    settled = -1  # tokens of a step in progress when Pause landed still arrive; then nothing may
    async with asyncio.timeout(60):
        while kept.token_count != settled:
            settled = kept.token_count
            await asyncio.sleep(0.5)
    assert settled < len(reference.tokens)
    load = await engine.load()
    assert load.running_requests + load.waiting_requests == 1
    await engine.control.Resume(engine_pb2.ResumeRequest(), timeout=30)
    result = await kept.result()
    assert result.complete.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert result.tokens == reference.tokens


async def test_pause_wait_returns_after_in_flight_finish(engine: ContractTarget) -> None:
    running = StreamWatcher(engine, request(engine, max_new_tokens=engine.long_tokens // 5, ignore_eos=True))
    await running.first_tokens()
    paused = await engine.control.Pause(engine_pb2.PauseRequest(mode=engine_pb2.PAUSE_MODE_WAIT), timeout=120)
    assert paused.state == engine_pb2.ENGINE_STATE_PAUSED
    load = await engine.load()  # Pause(WAIT) returned only once nothing was in flight
    assert (load.running_requests, load.waiting_requests) == (0, 0)
    finished = await running.result()
    assert finished.complete.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert len(finished.tokens) == engine.long_tokens // 5
    held = StreamWatcher(engine, request(engine, max_new_tokens=3, ignore_eos=True))
    await asyncio.sleep(0.3)
    assert held.token_count == 0
    await engine.control.Resume(engine_pb2.ResumeRequest(), timeout=30)
    assert len((await held.result()).tokens) == 3


async def _update(engine: ContractTarget, messages: list[engine_pb2.UpdateWeightsRequest]):
    async def stream():
        for message in messages:
            yield message

    return await engine.control.UpdateWeights(stream(), timeout=120)


async def test_update_weights_bumps_version_seen_in_tokens(engine: ContractTarget) -> None:
    before = (await engine.info()).weight_version
    response = await _update(
        engine,
        [
            engine_pb2.UpdateWeightsRequest(tensor=engine.sample_tensor),
            engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(flush_cache=True)),
        ],
    )
    assert response.weight_version == before + 1 and response.tensors_updated == 1
    assert response.bytes_received == len(engine.sample_tensor.data)
    assert (await engine.info()).weight_version == before + 1
    result = await collect(engine, request(engine, max_new_tokens=3, ignore_eos=True))
    assert result.complete.weight_version == before + 1
    assert {c.weight_version for c in result.chunks} == {before + 1}


async def test_update_weights_split_tensor_and_explicit_version(engine: ContractTarget) -> None:
    before = (await engine.info()).weight_version
    tensor = engine.sample_tensor
    half = len(tensor.data) // 2
    parts = [
        engine_pb2.TensorChunk(
            name=tensor.name, dtype=tensor.dtype, shape=tensor.shape, offset=0, data=tensor.data[:half]
        ),
        engine_pb2.TensorChunk(
            name=tensor.name, dtype=tensor.dtype, shape=tensor.shape, offset=half, data=tensor.data[half:]
        ),
    ]
    response = await _update(
        engine,
        [engine_pb2.UpdateWeightsRequest(tensor=p) for p in parts]
        + [engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(weight_version=before + 10))],
    )
    assert response.weight_version == before + 10 and response.tensors_updated == 1


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("no_commit", grpc.StatusCode.INVALID_ARGUMENT),
        ("short_bytes", grpc.StatusCode.INVALID_ARGUMENT),
        ("no_dtype", grpc.StatusCode.INVALID_ARGUMENT),
        ("after_commit", grpc.StatusCode.INVALID_ARGUMENT),
        ("old_version", grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
async def test_bad_weight_updates_change_nothing(engine: ContractTarget, case: str, code: grpc.StatusCode) -> None:
    before = (await engine.info()).weight_version
    tensor = engine.sample_tensor
    commit = engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit())
    good = engine_pb2.UpdateWeightsRequest(tensor=tensor)
    messages = {
        "no_commit": [good],
        "short_bytes": [
            engine_pb2.UpdateWeightsRequest(
                tensor=engine_pb2.TensorChunk(name=tensor.name, dtype=tensor.dtype, shape=tensor.shape, data=b"\0")
            ),
            commit,
        ],
        "no_dtype": [
            engine_pb2.UpdateWeightsRequest(
                tensor=engine_pb2.TensorChunk(name=tensor.name, shape=tensor.shape, data=tensor.data)
            ),
            commit,
        ],
        "after_commit": [good, commit, good],
        "old_version": [
            good,
            engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(weight_version=before)),
        ],
    }[case]
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await _update(engine, messages)
    assert error.value.code() == code
    assert (await engine.info()).weight_version == before


async def test_flush_cache_resets_prefix_reuse(engine: ContractTarget) -> None:
    prompt = [(5 * i) % 900 + 3 for i in range(160)]
    await collect(engine, request(engine, prompt=prompt, max_new_tokens=2, ignore_eos=True, temperature=0))
    await engine.control.FlushCache(engine_pb2.FlushCacheRequest(), timeout=30)
    again = await collect(engine, request(engine, prompt=prompt, max_new_tokens=2, ignore_eos=True, temperature=0))
    assert again.complete.cached_prompt_tokens == 0
