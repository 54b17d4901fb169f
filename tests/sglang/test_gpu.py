"""The real SGLang engine in a Ray actor behind the gRPC server: runs only where sglang and a CUDA GPU exist.

Not run on the development machine (no GPU; SGLang's kernels are GPU-only): there it skips and says why. The
model defaults to SmolLM2-135M-Instruct; ``AGENTLOOP_SGLANG_MODEL`` names another (a hub id or a local path).
"""

from __future__ import annotations

import importlib.util
import os

import grpc
import pytest
import ray

from agentloop_grpc.v1 import engine_pb2, generation_pb2

from ..contract.target import ContractTarget, collect, read_rest, request

MODEL = os.environ.get("AGENTLOOP_SGLANG_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")
PROMPT = [1, 4093, 198, 10898, 253, 1837, 30, 2, 198, 1, 520, 9531, 198]  # a ChatML user turn (SmolLM2 ids)


def _why_not() -> str | None:
    """Why the real engine cannot run here (None: it can). Checked at collection, before Ray starts."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed (SGLang's kernels are GPU-only; install sglang on a CUDA machine)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU: SGLang's kernels are GPU-only"
    return None


_WHY_NOT = _why_not()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")]


async def test_real_sglang_engine_through_ray_and_grpc(ray_cluster) -> None:
    from transformers import AutoConfig

    from agentloop_grpc.engine_adapters.server import create_server, start_adapter
    from agentloop_grpc.engine_adapters.sglang import ActorNaming, SglangEngine, SglangEngineConfig, deploy_tp_group

    naming = ActorNaming(prefix="gpu-test", namespace="agentloop-sglang-gpu-test")
    engine_kwargs = {"model_path": MODEL, "tp_size": 1, "enable_memory_saver": True, "mem_fraction_static": 0.5}
    actors = deploy_tp_group(naming, 0, 1, engine_kwargs, actor_options=lambda rank: {"num_gpus": 1})
    config = SglangEngineConfig(naming=naming, tp_size=1, discovery_timeout_s=60)
    server = await create_server(SglangEngine(config), "127.0.0.1:0")
    try:
        await start_adapter(server)
        address = f"127.0.0.1:{server.port}"
        async with grpc.aio.insecure_channel(address) as channel:
            hidden = AutoConfig.from_pretrained(MODEL).hidden_size
            tensor = engine_pb2.TensorChunk(
                name="model.norm.weight", dtype=engine_pb2.TENSOR_DTYPE_FLOAT32, shape=[hidden], data=bytes(4 * hidden)
            )
            target = ContractTarget("sglang", address, channel, PROMPT, 200, tensor)
            info = await target.info()
            assert info.engine_kind == "sglang" and info.engine_version.startswith("0.5")
            assert info.state == engine_pb2.ENGINE_STATE_RUNNING and info.sleep_releases_memory

            greedy = request(target, max_new_tokens=16, ignore_eos=True, temperature=0, top_logprobs=2)
            first, second = await collect(target, greedy), await collect(target, request(target, **_fields(greedy)))
            assert first.tokens == second.tokens and len(first.tokens) == 16
            assert len(first.logprobs) == 16 and all(lp <= 0 for lp in first.logprobs)
            assert all(len(c.top_logprobs) == len(c.token_ids) for c in first.chunks)

            call = target.generate.Generate(request(target, max_new_tokens=2000, ignore_eos=True), timeout=120)
            await call.read()
            assert (await target.load()).running_requests == 1
            await target.generate.Abort(generation_pb2.AbortRequest(all=True), timeout=30)
            assert (await read_rest(call))[-1].complete.finish_reason == generation_pb2.FINISH_REASON_ABORT

            await target.control.Pause(engine_pb2.PauseRequest(mode=engine_pb2.PAUSE_MODE_KEEP), timeout=60)
            await target.control.Resume(engine_pb2.ResumeRequest(), timeout=60)

            level = engine_pb2.SLEEP_LEVEL_KV_CACHE_AND_WEIGHTS
            slept = await target.control.Sleep(engine_pb2.SleepRequest(level=level), timeout=120)
            assert slept.memory_released
            await target.control.WakeUp(engine_pb2.WakeUpRequest(), timeout=120)
            assert (await collect(target, request(target, **_fields(greedy)))).tokens == first.tokens

            await target.control.FlushCache(engine_pb2.FlushCacheRequest(), timeout=60)

            async def update():
                yield engine_pb2.UpdateWeightsRequest(tensor=tensor)
                yield engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(flush_cache=True))

            updated = await target.control.UpdateWeights(update(), timeout=120)
            assert updated.weight_version == 1 and updated.tensors_updated == 1
    finally:
        await server.stop(grace_s=5)
        for actor in actors:
            ray.kill(actor)


def _fields(req: generation_pb2.GenerateRequest) -> dict:
    params = req.sampling_params
    return {field.name: value for field, value in params.ListFields()}
