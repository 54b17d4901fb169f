"""Routing: every contract call made over real gRPC reaches the stand-in engine in the rank-0 Ray actor, mapped
onto SGLang's Engine API, and what the engine streams comes back token-exact."""

from __future__ import annotations

import asyncio
import struct

import grpc
import pytest
import ray

from agentloop_grpc.v1 import engine_pb2, generation_pb2

from ..contract.target import ContractTarget, StreamWatcher, collect, generate_error, read_rest, request
from .conftest import sglang_server, standin_group
from .standin import standin_token

pytestmark = pytest.mark.usefixtures("ray_cluster")

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
VOCAB = 32_000


@pytest.fixture(scope="module")
async def served(ray_cluster):
    """A TP group of 2 (DP rank 1 of 2) behind one gRPC server; yields (target, group)."""
    async with standin_group(tp_size=2, dp_rank=1, token_latency_s=0.005) as group:
        async with sglang_server(group, model_id="") as server:
            address = f"127.0.0.1:{server.port}"
            async with grpc.aio.insecure_channel(address) as channel:
                yield ContractTarget("sglang", address, channel, PROMPT, 400, engine_pb2.TensorChunk()), group


@pytest.fixture
async def target(served):
    target, group = served
    await group.recorder.clear.remote()
    yield target
    await target.control.Resume(engine_pb2.ResumeRequest(), timeout=10)
    await target.control.WakeUp(engine_pb2.WakeUpRequest(), timeout=10)
    await target.generate.Abort(generation_pb2.AbortRequest(all=True), timeout=10)
    await target.wait_no_requests()


@pytest.fixture
def group(served):
    return served[1]


async def test_server_info_comes_from_the_rank_zero_engine(target: ContractTarget) -> None:
    info = await target.info()
    assert (info.engine_kind, info.engine_version, info.model_id) == ("sglang", "0.5.23 (stand-in)", "standin/model")
    assert (info.dp_rank, info.dp_size, info.tp_size) == (1, 2, 2)
    assert (info.vocab_size, info.max_model_len, list(info.eos_token_ids)) == (VOCAB, 4096, [2])
    assert info.sleep_releases_memory and info.supports_structured_output
    assert info.tokenizer_fingerprint.startswith("sha256:")
    assert info.state == engine_pb2.ENGINE_STATE_RUNNING


async def test_generate_streams_the_engines_tokens_and_logprobs(target: ContractTarget, group) -> None:
    req = request(target, max_new_tokens=9, ignore_eos=True, temperature=0.7, seed=42, top_k=0, top_logprobs=2)
    result = await collect(target, req)
    expected = [standin_token(42, PROMPT, i, VOCAB) for i in range(9)]
    assert result.tokens == [t for t, _ in expected]
    assert result.logprobs == pytest.approx([lp for _, lp in expected])
    tops = [alt for chunk in result.chunks for alt in chunk.top_logprobs]
    assert [list(a.token_ids) for a in tops] == [[t, (t + 1) % VOCAB] for t, _ in expected]
    assert result.complete.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert (result.complete.prompt_tokens, result.complete.completion_tokens) == (len(PROMPT), 9)
    (call,) = await group.calls("async_generate")
    assert call["rid"] == req.request_id and call["input_ids"] == PROMPT
    logprob_args = (call["return_logprob"], call["top_logprobs_num"], call["logprob_start_len"])
    assert logprob_args == (True, 2, -1) and call["stream"]
    params = call["sampling_params"]
    assert params["sampling_seed"] == 42 and params["top_k"] == -1 and params["temperature"] == pytest.approx(0.7)
    assert (params["max_new_tokens"], params["ignore_eos"], params["no_stop_trim"]) == (9, True, True)


async def test_an_engine_without_routed_expert_capture_refuses_the_opt_in(target: ContractTarget, group) -> None:
    # the stand-in here was not started with enable_return_routed_experts (test_routed_experts.py's is)
    info = await target.info()
    assert (info.routed_expert_layers, info.routed_experts_per_token, info.num_experts) == (0, 0, 0)
    error = await generate_error(target, request(target, max_new_tokens=2, return_routed_experts=True))
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION and "return_routed_experts" in error.details()
    assert not await group.calls("async_generate", timeout_s=0)


async def test_stop_token_is_reported_as_sglangs_matched_token(target: ContractTarget, group) -> None:
    expected = [standin_token(0, PROMPT, i, VOCAB)[0] for i in range(20)]
    stop = expected[4]
    req = request(target, max_new_tokens=20, temperature=0, ignore_eos=True, stop_token_ids=[stop])
    result = await collect(target, req)
    assert result.tokens == expected[: expected.index(stop) + 1]
    assert result.complete.finish_reason == generation_pb2.FINISH_REASON_STOP
    assert result.complete.matched_stop_token_id == stop
    (call,) = await group.calls("async_generate")
    assert call["sampling_params"]["stop_token_ids"] == [stop]


@pytest.mark.parametrize(
    ("field", "spec", "sglang_key"),
    [
        ("json_schema", '{"type": "object"}', "json_schema"),
        ("regex", "[ab]+", "regex"),
        ("ebnf_grammar", 'root ::= "a"', "ebnf"),
    ],
)
async def test_structured_output_maps_to_sglang_sampling_params(target, group, field, spec, sglang_key) -> None:
    req = request(target, max_new_tokens=2, ignore_eos=True)
    req.structured_output.CopyFrom(generation_pb2.StructuredOutput(**{field: spec}))
    await collect(target, req)
    (call,) = await group.calls("async_generate")
    assert call["sampling_params"][sglang_key] == spec


async def test_grammar_sglang_rejects_is_invalid_argument(target: ContractTarget) -> None:
    req = request(target, max_new_tokens=2)
    req.structured_output.CopyFrom(generation_pb2.StructuredOutput(ebnf_grammar='root ::= "a" %unsupported'))
    error = await generate_error(target, req)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "SGLang rejected the request: Failed to compile the EBNF grammar" in error.details()


async def test_abort_reaches_the_engine(target: ContractTarget, group) -> None:
    req = request(target, max_new_tokens=400, ignore_eos=True)
    call = target.generate.Generate(req, timeout=60)
    first = await call.read()
    assert isinstance(first, generation_pb2.GenerateResponse)
    aborted = await target.generate.Abort(generation_pb2.AbortRequest(request_ids=[req.request_id]), timeout=10)
    assert list(aborted.aborted_request_ids) == [req.request_id]
    rest = await read_rest(call)
    assert rest[-1].complete.finish_reason == generation_pb2.FINISH_REASON_ABORT
    delivered = len(first.chunk.token_ids) + sum(len(m.chunk.token_ids) for m in rest[:-1])
    assert rest[-1].complete.completion_tokens == delivered
    assert await group.calls("abort_request", where=lambda p: p["rid"] == req.request_id)
    load = await target.wait_no_requests()
    assert load.running_requests == 0


async def test_client_cancel_aborts_in_the_engine(target: ContractTarget, group) -> None:
    req = request(target, max_new_tokens=400, ignore_eos=True)
    call = target.generate.Generate(req, timeout=60)
    await call.read()
    call.cancel()
    assert await group.calls("abort_request", where=lambda p: p["rid"] == req.request_id)
    assert (await target.wait_no_requests()).running_requests == 0


@pytest.mark.parametrize(
    ("mode", "sglang_mode"),
    [
        (engine_pb2.PAUSE_MODE_ABORT, None),  # the lifecycle aborts and holds: SGLang has nothing to do
        (engine_pb2.PAUSE_MODE_KEEP, "in_place"),
        (engine_pb2.PAUSE_MODE_WAIT, None),  # the lifecycle holds newcomers and waits
    ],
)
async def test_pause_holds_new_requests_and_keep_reaches_the_engine(
    target: ContractTarget, group, mode: int, sglang_mode: str | None
) -> None:
    paused = await target.control.Pause(engine_pb2.PauseRequest(mode=mode), timeout=10)
    assert paused.state == engine_pb2.ENGINE_STATE_PAUSED
    expected = [sglang_mode] if sglang_mode else []
    assert [p["mode"] for p in await group.calls("pause_generation", count=len(expected))] == expected
    held = StreamWatcher(target, request(target, max_new_tokens=3, ignore_eos=True))
    await asyncio.sleep(0.3)
    assert held.token_count == 0 and (await target.load()).waiting_requests == 1
    assert await group.calls("async_generate", count=0, timeout_s=0) == []  # held here, not sent to SGLang
    resumed = await target.control.Resume(engine_pb2.ResumeRequest(), timeout=10)
    assert resumed.state == engine_pb2.ENGINE_STATE_RUNNING
    assert len(await group.calls("continue_generation", count=len(expected))) == len(expected)
    assert len((await held.result()).tokens) == 3


async def test_pause_keep_continues_token_exact_and_blocks_flush(target: ContractTarget, group) -> None:
    kept = StreamWatcher(target, request(target, max_new_tokens=60, ignore_eos=True, seed=7))
    await kept.first_tokens()
    paused = await target.control.Pause(engine_pb2.PauseRequest(mode=engine_pb2.PAUSE_MODE_KEEP), timeout=10)
    assert paused.kept_requests == 1
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await target.control.FlushCache(engine_pb2.FlushCacheRequest(), timeout=10)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "Pause(KEEP)" in error.value.details()
    await target.control.Resume(engine_pb2.ResumeRequest(), timeout=10)
    result = await kept.result()
    assert result.tokens == [standin_token(7, PROMPT, i, VOCAB)[0] for i in range(60)]


@pytest.mark.parametrize(
    ("level", "tags"),
    [
        (engine_pb2.SLEEP_LEVEL_KV_CACHE, ["kv_cache"]),
        (engine_pb2.SLEEP_LEVEL_KV_CACHE_AND_WEIGHTS, ["weights", "kv_cache"]),
    ],
)
async def test_sleep_and_wake_release_and_resume_memory_occupation(target: ContractTarget, group, level, tags) -> None:
    slept = await target.control.Sleep(engine_pb2.SleepRequest(level=level), timeout=10)
    assert slept.memory_released and slept.state == engine_pb2.ENGINE_STATE_SLEEPING
    assert [p["tags"] for p in await group.calls("release_memory_occupation")] == [tags]
    if "weights" in tags:
        weights_only = engine_pb2.WakeUpRequest(tags=[engine_pb2.WAKE_UP_TAG_WEIGHTS])
        partial = await target.control.WakeUp(weights_only, timeout=10)
        assert partial.state == engine_pb2.ENGINE_STATE_SLEEPING
    woke = await target.control.WakeUp(engine_pb2.WakeUpRequest(), timeout=10)
    assert woke.state == engine_pb2.ENGINE_STATE_RUNNING
    resumed = [p["tags"] for p in await group.calls("resume_memory_occupation", count=len(tags))]
    assert resumed == ([["weights"], ["kv_cache"]] if "weights" in tags else [["kv_cache"]])


async def test_sleep_without_memory_saver_frees_nothing_and_says_so() -> None:
    async with standin_group(enable_memory_saver=False) as group, sglang_server(group) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            target = ContractTarget("sglang", "", channel, PROMPT, 10, engine_pb2.TensorChunk())
            assert not (await target.info()).sleep_releases_memory
            kv_only = engine_pb2.SleepRequest(level=engine_pb2.SLEEP_LEVEL_KV_CACHE)
            slept = await target.control.Sleep(kv_only, timeout=10)
            assert not slept.memory_released and slept.state == engine_pb2.ENGINE_STATE_SLEEPING
            await target.control.WakeUp(engine_pb2.WakeUpRequest(), timeout=10)
            assert await group.calls("release_memory_occupation", count=0, timeout_s=0.3) == []


def _tensor(name: str, values: list[float]) -> engine_pb2.UpdateWeightsRequest:
    data = struct.pack(f"<{len(values)}f", *values)
    chunk = engine_pb2.TensorChunk(name=name, dtype=engine_pb2.TENSOR_DTYPE_FLOAT32, shape=[2, 2], data=data)
    return engine_pb2.UpdateWeightsRequest(tensor=chunk)


async def _update(target: ContractTarget, *messages: engine_pb2.UpdateWeightsRequest):
    async def stream():
        for message in messages:
            yield message

    return await target.control.UpdateWeights(stream(), timeout=30)


async def test_update_weights_passes_tensors_to_every_tp_rank(target: ContractTarget, group) -> None:
    before = (await target.info()).weight_version
    commit = engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(flush_cache=True))
    response = await _update(target, _tensor("model.norm.weight", [1.0, 2.0, 3.5, -4.0]), commit)
    assert response.weight_version == before + 1 and response.tensors_updated == 1
    (call,) = await group.calls("update_weights_from_tensor")
    assert call["ranks"] == 2 and call["flush_cache"] and call["weight_version"] == str(before + 1)
    assert call["tensors"] == [("model.norm.weight", "torch.float32", (2, 2), [1.0, 2.0, 3.5, -4.0])]
    result = await collect(target, request(target, max_new_tokens=2, ignore_eos=True))
    assert result.complete.weight_version == before + 1


async def test_weight_update_sglang_refuses_is_invalid_and_changes_nothing(target: ContractTarget) -> None:
    before = (await target.info()).weight_version
    commit = engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit())
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await _update(target, _tensor("no.such.weight", [0.0] * 4), commit)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "SGLang refused the weight update" in error.value.details() and "no.such.weight" in error.value.details()
    assert (await target.info()).weight_version == before


async def test_flush_cache_reaches_the_engine_and_resets_prefix_reuse(target: ContractTarget, group) -> None:
    prompt = [(3 * i) % 500 + 3 for i in range(64)]
    await collect(target, request(target, prompt=prompt, max_new_tokens=2, ignore_eos=True, temperature=0))
    cached = await collect(target, request(target, prompt=prompt, max_new_tokens=2, ignore_eos=True, temperature=0))
    assert cached.complete.cached_prompt_tokens == 48
    await target.control.FlushCache(engine_pb2.FlushCacheRequest(), timeout=10)
    assert [p["success"] for p in await group.calls("flush_cache")] == [True]
    again = await collect(target, request(target, prompt=prompt, max_new_tokens=2, ignore_eos=True, temperature=0))
    assert again.complete.cached_prompt_tokens == 0


async def test_load_reports_sglangs_kv_usage_and_the_requests_in_flight(target: ContractTarget) -> None:
    calls = [target.generate.Generate(request(target, max_new_tokens=400, ignore_eos=True)) for _ in range(2)]
    for call in calls:
        await call.read()
    await asyncio.sleep(0.5)  # two load polls
    load = await target.load()
    assert (load.running_requests, load.waiting_requests, load.max_running_requests) == (2, 0, 512)
    assert load.kv_cache_usage == pytest.approx(2 / 512)
    for call in calls:
        call.cancel()


async def test_dead_rank_zero_actor_is_unavailable() -> None:
    async with standin_group() as group, sglang_server(group) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            target = ContractTarget("sglang", "", channel, PROMPT, 10, engine_pb2.TensorChunk())
            ray.kill(group.actors[0])
            error = await generate_error(target, request(target, max_new_tokens=2))
            assert error.code() == grpc.StatusCode.UNAVAILABLE and "rank-0 actor" in error.details()


async def test_requests_carry_their_weight_version_as_sglangs_cache_salt(target: ContractTarget, group) -> None:
    """SGLang keys its radix cache by the salt: a request never matches what other weights computed."""
    version = (await target.control.GetServerInfo(engine_pb2.GetServerInfoRequest(), timeout=10)).weight_version
    await collect(target, request(target, max_new_tokens=1))
    (call,) = await group.calls("async_generate")
    assert call["cache_salt"] == f"agentloop-weights-{version}"
