"""verl's own rollout machinery on our engines, selected by verl's config alone (``rollout.name=agentloop``, found
through our ``verl.plugins`` entry point): verl's ``LLMServerManager`` launches an embedded engine server through
our replica on a real local Ray, verl's own client and load balancer generate on it, and verl's replica calls
(abort, resume, clear cache, sleep, wake up, KV release) reach the engine, checked on the engine side."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest

pytest.importorskip("verl", reason="verl is not installed (make setup installs it)")

import ray
import torch
from verl.checkpoint_engine import CheckpointEngineRegistry
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils.import_utils import import_external_libs
from verl.workers.config import CheckpointEngineConfig
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.rollout.replica import get_rollout_replica_class

from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import EngineState, SamplingParams
from agentloop_grpc.integrations.verl.checkpoint_engine import AgentloopCheckpointEngine
from agentloop_grpc.integrations.verl.checkpoint_manager import AgentloopCheckpointManager
from agentloop_grpc.integrations.verl.replica import AgentloopReplica
from agentloop_grpc.integrations.verl.rollout_adapter import AgentloopRolloutAdapter
from agentloop_grpc.integrations.verl.server_actor import EngineServerActor
from agentloop_grpc.router import Fleet, GenerateCall, Router

from ..ray_start import init_ray
from .verl_config import verl_config

PROMPT = [1, 9690, 198, 2683, 314, 253, 5356, 2]  # any ids the model's vocabulary holds
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


def _config():
    return verl_config([
        "actor_rollout_ref.rollout.name=agentloop", "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.prompt_length=256", "actor_rollout_ref.rollout.response_length=16",
        "+actor_rollout_ref.rollout.repetition_penalty=1.5",  # verl's servers apply it to every call: so must ours
        "+actor_rollout_ref.rollout.custom={agentloop: {engine: embedded, "
        "engine_config: {max_running: 4, max_model_len: 1024}}}",
        f"actor_rollout_ref.model.path={model_store.prepare()}",
    ])


@pytest.fixture(scope="module")
def local_ray():
    # a server actor, verl's balancer and a 2-rank worker group need more CPUs than a Ray left by earlier tests
    if ray.is_initialized() and ray.cluster_resources().get("CPU", 0) < 4:
        ray.shutdown()
    started = init_ray(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
async def manager(local_ray):
    manager = LLMServerManager.create(config=_config())  # as verl's trainer calls it: synchronously
    yield manager
    for replica in manager.get_replicas():
        await replica.stop(grace_s=2)


async def _state(address: str) -> EngineState | None:
    async with Fleet([address]) as fleet:
        return (await fleet.server_info()).raise_for_errors().responses[address].state


def test_the_rollout_name_finds_our_replica_through_verls_registry() -> None:
    assert get_rollout_replica_class("agentloop") is AgentloopReplica


async def test_verls_client_and_balancer_generate_on_our_engine_server(manager) -> None:
    (address,) = manager.get_addresses()
    output = await manager.get_client().generate("traj-1", prompt_ids=PROMPT, sampling_params=dict(GREEDY))
    async with Router([address]) as router:
        direct = await router.generate(GenerateCall("direct", PROMPT, SamplingParams(
            max_new_tokens=16, temperature=0.0, logprobs=True, repetition_penalty=1.5)))
    assert output.token_ids == list(direct.token_ids) and len(output.token_ids) == 16  # response_length bounds it
    assert output.log_probs == pytest.approx(list(direct.logprobs), abs=1e-5)
    assert output.stop_reason == "completed"


async def test_the_server_actors_client_finds_pictures_spans_with_the_replicas_model(manager) -> None:
    from PIL import Image

    # the bundled model is text-only, so the actor's client names the model it was handed and refuses the picture
    needle = f"the model at {re.escape(str(model_store.prepare()))} has no processor that takes images"
    with pytest.raises(ValueError, match=needle):
        await manager.get_client().generate("traj-picture", prompt_ids=PROMPT, sampling_params=dict(GREEDY),
                                            image_data=[Image.new("RGB", (8, 8))])


async def test_abort_pauses_the_engine_and_resume_lets_held_calls_finish(manager) -> None:
    (replica,) = manager.get_replicas()
    (address,) = manager.get_addresses()
    client = manager.get_client()
    long = {**GREEDY, "max_tokens": 16, "ignore_eos": True}
    running = asyncio.ensure_future(client.generate("traj-a", prompt_ids=PROMPT, sampling_params=long))
    await asyncio.sleep(0.5)
    await replica.abort_all_requests()
    aborted = await running
    assert aborted.stop_reason == "aborted" and len(aborted.token_ids) < 16
    assert await _state(address) == EngineState.PAUSED
    held = asyncio.ensure_future(client.generate("traj-b", prompt_ids=PROMPT, sampling_params=long))
    await asyncio.sleep(0.5)
    assert not held.done()  # parked until resume, as verl's own servers do during a weight sync
    await replica.resume_generation()
    assert len((await held).token_ids) == 16
    assert await _state(address) == EngineState.RUNNING
    await replica.clear_kv_cache()


async def test_abort_with_reject_answers_new_calls_aborted_at_once(manager) -> None:
    (replica,) = manager.get_replicas()
    await replica.abort_all_requests(reject_request=True)
    try:
        rejected = await asyncio.wait_for(
            manager.get_client().generate("traj-c", prompt_ids=PROMPT, sampling_params=dict(GREEDY)), 10)
        assert rejected.stop_reason == "aborted" and rejected.token_ids == []
    finally:
        await replica.resume_generation()


async def test_sleep_wake_and_kv_release_reach_the_engine_in_hybrid_mode(manager) -> None:
    """Standalone servers keep their memory (as verl's own); a hybrid replica's server sleeps while the trainer
    trains: the actor's class in hybrid mode on the same server shows what verl's calls do to the engine (here in
    this process: the manager's own replica already runs it as a Ray actor, and a second one costs a process)."""
    (address,) = manager.get_addresses()
    actor = EngineServerActor(_config(), "hybrid", address=address)
    await actor.start()
    try:
        await actor.sleep()
        assert await _state(address) == EngineState.SLEEPING
        await actor.wake_up()
        assert await _state(address) == EngineState.RUNNING
        await actor.release_kv_cache()
        assert await _state(address) == EngineState.SLEEPING
        await actor.resume_kv_cache()
        assert await _state(address) == EngineState.RUNNING
    finally:
        await actor.stop()


def _model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_store.prepare()), dtype=torch.float32)


async def _greedy_logprobs(address: str) -> list[float]:
    async with Router([address]) as router:
        result = await router.generate(GenerateCall("probe", PROMPT, SamplingParams(
            max_new_tokens=4, temperature=0.0, logprobs=True)))
    return list(result.logprobs)


async def _version(address: str) -> int:
    async with Fleet([address]) as fleet:
        return (await fleet.server_info()).raise_for_errors().responses[address].weight_version


async def test_verls_checkpoint_engine_pushes_the_trainers_weights_to_our_servers(manager) -> None:
    """verl's trainer ranks call ``send_weights(per-tensor params, global_steps)``: rank 0 applies them on every
    server (here by a weight group: the transfer ``auto`` picks on one machine), the others only walk them."""
    (address,) = manager.get_addresses()
    model = _model()
    before = await _greedy_logprobs(address)
    import_external_libs("agentloop_grpc.integrations.verl.checkpoint_engine")  # as verl does for the config key
    sender = CheckpointEngineRegistry.new("agentloop", bucket_size=64 << 20, is_master=True)
    walker = CheckpointEngineRegistry.new("agentloop", bucket_size=64 << 20, is_master=False)
    assert isinstance(sender, AgentloopCheckpointEngine)
    sender.init_process_group(servers=[address])
    walked: list[str] = []

    def walk() -> Iterator[tuple[str, torch.nn.Parameter]]:
        for name, parameter in model.named_parameters():
            walked.append(name)
            yield name, parameter

    assert await walker.send_weights(walk(), 3) == {}
    assert walked and await _version(address) != 3  # walked, nothing sent
    with torch.no_grad():
        model.model.norm.weight.mul_(0.5)
    metrics = await sender.send_weights(iter(list(model.named_parameters())), global_steps=3)
    assert await _version(address) == 3 and metrics["agentloop/weight_bytes"] > 0
    changed = await _greedy_logprobs(address)
    assert changed != pytest.approx(before, abs=1e-4)  # the halved norm reached the engine
    with torch.no_grad():
        model.model.norm.weight.mul_(2.0)
    await sender.send_weights(model.named_parameters(), global_steps=4)
    assert await _version(address) == 4
    assert await _greedy_logprobs(address) == pytest.approx(before, abs=1e-5)
    assert sender._pusher.transfer == "collective"
    await sender._pusher.close()


async def test_verls_hybrid_weight_sync_steps_reach_the_engine(manager) -> None:
    """What verl's trainer worker does with the naive backend: release between rollouts, then resume weights,
    update, resume the KV cache, through the in-trainer rollout handle ``rollout.name=agentloop`` resolves to."""
    (address,) = manager.get_addresses()
    config = _config()
    adapter = get_rollout_class("agentloop", "async")(
        config=config.actor_rollout_ref.rollout, model_config=config.actor_rollout_ref.model, device_mesh=None)
    assert isinstance(adapter, AgentloopRolloutAdapter)
    assert adapter.is_leader_rank and adapter.replica_rank == 0
    await adapter.release()
    assert await _state(address) == EngineState.SLEEPING
    await adapter.resume(tags=["weights"])
    await adapter.update_weights(_model().named_parameters(), global_steps=9)
    assert await _state(address) == EngineState.SLEEPING  # the KV cache is still released
    await adapter.resume(tags=["kv_cache"])
    assert await _state(address) == EngineState.RUNNING and await _version(address) == 9
    assert len(await _greedy_logprobs(address)) == 4
    with pytest.raises(ValueError, match="lora"):
        await adapter.update_weights(iter(()), peft_config={"r": 8})


class TrainerRank(Worker):
    """A verl trainer rank reduced to its weight-sync calls: the same verl decorators and dispatch modes as
    verl's ActorRolloutRefWorker, the checkpoint engine built as it builds it, the model's parameters as its
    engine's per-tensor params (FSDP is not needed to see what verl's manager does with them)."""

    def __init__(self) -> None:
        super().__init__()
        import_external_libs("agentloop_grpc.integrations.verl.checkpoint_engine")
        self.checkpoint_engine = CheckpointEngineRegistry.new("agentloop", is_master=self.rank == 0,
                                                              bucket_size=64 << 20)
        self.model = _model()
        with torch.no_grad():
            self.model.model.norm.weight.mul_(0.5)

    @register(dispatch_mode=Dispatch["DP_COMPUTE"], blocking=False)  # verl registers its modes at import time
    def execute_checkpoint_engine(self, method: str, *args, **kwargs):
        return getattr(self.checkpoint_engine, method)(*args, **kwargs)

    @register(dispatch_mode=Dispatch["ONE_TO_ALL"], blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto"):
        return await self.checkpoint_engine.send_weights(self.model.named_parameters(), global_steps=global_steps)


async def test_verls_checkpoint_manager_class_updates_every_replica_from_the_trainer_ranks(manager) -> None:
    """``checkpoint_manager_class`` + backend ``agentloop``: verl's trainer calls ``update_weights(step)``; rank 0
    of a real verl worker group pushes, rank 1 walks, and the replica's server serves the new version."""
    (address,) = manager.get_addresses()
    before = await _greedy_logprobs(address)
    ranks = RayWorkerGroup(resource_pool=RayResourcePool([2], use_gpu=False, max_colocate_count=1),
                           ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(TrainerRank)), device_name="cpu")
    config = CheckpointEngineConfig(backend="agentloop",
                                    custom_backend_module="agentloop_grpc.integrations.verl.checkpoint_engine")
    checkpoints = AgentloopCheckpointManager(config=config, actor_wg=ranks, replicas=manager.get_replicas())
    try:
        metrics = await checkpoints.update_weights(12)
        assert metrics["agentloop/weight_bytes"] > 0
        assert await _version(address) == 12
        assert await _greedy_logprobs(address) != pytest.approx(before, abs=1e-4)
    finally:
        for worker in ranks.workers:
            ray.kill(worker)
