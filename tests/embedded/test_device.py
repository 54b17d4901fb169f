"""The embedded engine's device, up to the boundary this CPU machine can reach: the config field, the refusal of a
GPU that is not there, tensors made on the configured device (``meta`` stands in for a GPU: a device that is not
the CPU, where shapes work but no data lives), and Sleep dropping every reference to what it frees."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from pydantic import ValidationError

from agentloop_grpc.common.types import ALL_RESOURCES, NamedTensor
from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.embedded.device import placement
from agentloop_grpc.engine_adapters.embedded.kv_cache import KVShape, SlotKVCache
from agentloop_grpc.engine_adapters.embedded.weight_update import WeightOffload, apply, stage

from .helpers import chat, generate

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: nothing to refuse")


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:0", "cuda:7"])
def test_the_device_field_takes_cpu_and_cuda_devices(name: str) -> None:
    assert EmbeddedEngineConfig(device=name).device == name


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "mps", "CPU", "cuda:0,1"])
def test_the_device_field_refuses_other_names(name: str) -> None:
    with pytest.raises(ValidationError, match="device"):
        EmbeddedEngineConfig(device=name)


@NO_GPU
def test_a_missing_gpu_is_named_before_anything_loads() -> None:
    assert placement("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device 'cuda:0': this machine has no usable CUDA GPU"):
        placement("cuda:0")


@NO_GPU
async def test_an_engine_on_a_missing_gpu_fails_to_start_with_that_reason(tmp_path) -> None:
    engine = EmbeddedEngine(EmbeddedEngineConfig(device="cuda", model=str(tmp_path / "never-read")))
    try:
        with pytest.raises(ValueError, match="no usable CUDA GPU"):  # the model folder is not even looked at
            await engine.start(lambda: 0)
    finally:
        await engine.shutdown()


def test_kv_buffers_live_on_the_configured_device_and_release_drops_them() -> None:
    cache = SlotKVCache(KVShape(layers=2, slots=3, kv_heads=2, max_len=8, head_dim=4), torch.device("meta"))
    cache.allocate()
    assert {t.device.type for t in (*cache.keys, *cache.values)} == {"meta"}
    assert cache.nbytes == 3 * 8 * 2 * 2 * 2 * 4 * 4
    block = cache.read(1, 0, 4)
    assert block.device.type == "meta" and block.shape == (2, 2, 2, 4, 4)
    buffer = weakref.ref(cache.keys[0])
    cache.release()
    gc.collect()
    assert not cache.allocated and buffer() is None


def test_staged_weights_land_on_the_parameters_device() -> None:
    model = torch.nn.Linear(2, 3, bias=False, device="meta")
    value = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    staged = stage(model, [NamedTensor("weight", "float32", (3, 2), value.numpy().tobytes())])
    assert [v.device.type for _, v in staged] == ["meta"]
    apply(staged)
    assert model.weight.device.type == "meta" and model.weight.shape == (3, 2)


def test_offload_on_the_cpu_keeps_the_values_in_a_file_and_restores_them(tmp_path) -> None:
    model = torch.nn.Linear(4, 4)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    offload = WeightOffload(model, tmp_path, torch.device("cpu"))
    offload.offload()
    assert offload.offloaded and all(p.numel() == 0 for p in model.parameters())
    assert len(list(tmp_path.glob("weights-*.safetensors"))) == 1
    offload.restore()
    assert not offload.offloaded and not list(tmp_path.iterdir())
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


async def test_sleep_drops_every_reference_to_the_kv_cache_and_the_weights(engine, tokenizer) -> None:
    """What Sleep frees must be unreachable afterwards, or a GPU's allocator could not give it back."""
    await generate(engine, chat(tokenizer, "Count to three."), max_new_tokens=4, ignore_eos=True, temperature=0.0)
    adapter = engine.adapter
    runner = adapter._loaded.runner  # the one place the test reaches inside: what the engine holds
    assert len(adapter.prefix_cache) > 0
    kv, block = weakref.ref(runner.kv.keys[0]), weakref.ref(next(iter(adapter.prefix_cache._blocks.values())).kv)
    weight = adapter._loaded.model.get_decoder().layers[0].mlp.up_proj.weight
    assert await engine.sleep(2)
    gc.collect()
    assert kv() is None and block() is None and len(adapter.prefix_cache) == 0
    assert weight.numel() == 0
    await engine.wake_up(ALL_RESOURCES)
    assert runner.kv.allocated and weight.numel() > 0
