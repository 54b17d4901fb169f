"""Runs inside vLLM's engine process: the worker extension that stages weights and swaps them into the model.

vLLM mixes this class into its worker class (engine argument ``worker_extension_cls``), which makes these
methods callable through ``AsyncLLM.collective_rpc``. The EngineCore runs such calls between scheduler steps,
on its own thread, so a call must return quickly: whatever may take long (joining a weight group, receiving its
broadcast, reading a checkpoint) runs as a background job on a thread of the worker while the engine keeps
stepping, and the adapter polls the job (``agentloop_poll``). Every update is staged first (a list of checkpoint-
format tensors under a key) and swapped in by one ``agentloop_apply`` that the adapter calls while generation is
paused: vLLM's in-place reload (``reload_weights`` with checkpoint-format tensors) maps checkpoint names onto
vLLM's fused parameters and re-runs the per-layer processing (on CPU, vLLM repacks linear weights for its GEMM
kernels and drops the plain weight, so copying into parameters is not enough), with every fused layer completed
first (``weights.FusedLayers``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors import safe_open

from agentloop_grpc.common.weight_group import WeightGroupMember
from agentloop_grpc.common.weight_layout import BucketLayout, TensorSpec, WeightGroupError, WeightGroupSpec

from .routing import moe_layer_ids
from .weights import CheckpointPlan, FusedLayers, WirePayload

Staged = list[tuple[str, torch.Tensor]]

#: What ``agentloop_poll`` answers: ("pending", None), ("done", the job's result), ("group_error", message) when
#: a weight group failed (a rank left or timed out), ("error", message) for anything else.
PollAnswer = tuple[str, object]


class _WeightState:
    """One worker's weight groups, background jobs and staged updates."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="agentloop-weights")
        self.lock = threading.Lock()  # a job may finish before submit() returns: it stages under this lock
        self.jobs: dict[str, Future] = {}
        self.groups: dict[str, WeightGroupMember] = {}
        self.staged: dict[str, Staged] = {}
        self.fused: FusedLayers | None = None


class AgentloopWorkerExtension:
    """Extra worker methods (the ``agentloop_`` prefix keeps them clear of vLLM's own names)."""

    def _agentloop(self) -> _WeightState:
        # vLLM builds the worker with its own constructor, so the state is created on first use.
        return self.__dict__.setdefault("_agentloop_state", _WeightState())

    def _agentloop_start(self, key: str, job: Callable[[], object]) -> None:
        state = self._agentloop()
        if key in state.jobs:
            raise RuntimeError(f"a weight job {key!r} is already under way")
        with state.lock:
            state.jobs[key] = state.pool.submit(job)

    def _agentloop_stage(self, key: str, weights: Staged) -> None:
        state = self._agentloop()
        with state.lock:
            if key in state.jobs:  # a job the adapter gave up on (forgot) while it ran stages nothing
                state.staged[key] = weights

    def agentloop_packed_modules(self) -> dict[str, list[str]]:
        """The model's fused parameters, e.g. ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}`` (a class
        attribute vLLM models declare for LoRA and quantization; models without fused layers have none)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]  # the worker this class extends
        return {fused: list(members) for fused, members in getattr(model, "packed_modules_mapping", {}).items()}

    def agentloop_moe_layers(self) -> list[int]:
        """The decoder layers whose expert routing vLLM reports (``routing.moe_layer_ids``)."""
        return moe_layer_ids(self.model_runner.get_model())  # type: ignore[attr-defined]  # the extended worker

    # -- background jobs -------------------------------------------------------------------------------------

    def agentloop_poll(self, key: str) -> PollAnswer:
        """How the job ``key`` stands; a finished job's answer stays until ``agentloop_forget``."""
        job = self._agentloop().jobs.get(key)
        if job is None:
            return "error", f"no weight job {key!r} in this worker"
        if not job.done():
            return "pending", None
        error = job.exception()
        if isinstance(error, WeightGroupError):
            return "group_error", str(error)
        if error is not None:
            return "error", f"{type(error).__name__}: {error}"
        return "done", job.result()

    def agentloop_forget(self, key: str) -> None:
        """Drop the job ``key`` and what it staged (after apply, or when the update was given up)."""
        state = self._agentloop()
        with state.lock:
            state.jobs.pop(key, None)
            state.staged.pop(key, None)

    # -- staging ---------------------------------------------------------------------------------------------

    def agentloop_stage_payload(self, key: str, payload: WirePayload) -> None:
        """Stage streamed tensors (already checked by the adapter)."""
        self._agentloop().staged[key] = [(name, _tensor(dtype, shape, data)) for name, dtype, shape, data in payload]

    def agentloop_read_checkpoint(self, key: str, plan: CheckpointPlan) -> None:
        """Start reading the checkpoint ``plan`` names (checked by the adapter from its headers); the job's
        result is the bytes read."""

        def read() -> int:
            tensors: Staged = []
            for file, names in plan:
                with safe_open(file, framework="pt") as checkpoint:  # memory-mapped: read once, from the page cache
                    tensors += [(target, checkpoint.get_tensor(name)) for name, target in names]
            self._agentloop_stage(key, tensors)
            return sum(t.numel() * t.element_size() for _, t in tensors)

        self._agentloop_start(key, read)

    def agentloop_join_group(self, key: str, group: tuple) -> None:
        """Start joining the weight group ``group`` (``WeightGroupSpec``'s fields) at rank ``rank_offset`` plus
        this worker's rank; the job's result is that rank."""
        spec = WeightGroupSpec(*group)
        rank = spec.rank_offset + self.rank  # type: ignore[attr-defined]  # 0..tp*pp-1 inside one engine
        groups = self._agentloop().groups

        def join() -> int:
            groups[spec.name] = WeightGroupMember.join(spec, rank)
            return rank

        self._agentloop_start(key, join)

    def agentloop_receive(
        self, key: str, group: str, specs: list[tuple[str, str, list[int]]], bucket_bytes: int, targets: list[str],
        agree: bool,
    ) -> None:
        """Start voting on the update ``specs`` announce (no unless ``agree``) and receiving it; the job's
        result is whether every rank agreed (then the tensors are staged under ``key`` as ``targets``)."""
        state = self._agentloop()
        member = state.groups[group]
        layout = BucketLayout.of([TensorSpec(name, dtype, tuple(shape)) for name, dtype, shape in specs], bucket_bytes)

        def receive() -> bool:
            flat = member.vote_and_receive(layout, agree)
            if flat is None:
                return False
            self._agentloop_stage(key, [(target, view) for target, (_, view) in zip(targets, layout.views(flat))])
            return True

        self._agentloop_start(key, receive)

    def agentloop_leave_group(self, group: str) -> None:
        member = self._agentloop().groups.pop(group, None)
        if member is not None:
            member.close()

    # -- the swap --------------------------------------------------------------------------------------------

    def agentloop_apply(self, key: str) -> int:
        """Load the update staged under ``key`` into the model; return how many tensors it named."""
        state = self._agentloop()
        with state.lock:
            weights = state.staged.pop(key)
            state.jobs.pop(key, None)
        if state.fused is None:
            config = self.model_config  # type: ignore[attr-defined]
            state.fused = FusedLayers(Path(config.model), config.dtype, self.agentloop_packed_modules())
        complete = state.fused.complete(weights)
        runner = self.model_runner  # type: ignore[attr-defined]
        with torch.no_grad(), _partial_reload_is_expected():
            runner.reload_weights(weights_iterator=complete, is_checkpoint_format=True)
        state.fused.commit(complete)
        return len(weights)


def _tensor(dtype: str, shape: list[int], data: bytes) -> torch.Tensor:
    torch_dtype = getattr(torch, dtype)
    if not data:  # a zero-sized tensor: frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=torch_dtype)
    return torch.frombuffer(bytearray(data), dtype=torch_dtype).reshape(shape)


# vLLM's reload warns once per layer an update leaves out ("Failed to load weights", then "Following weights were
# not loaded"): right for a full reload from disk, noise for our updates, which name only what changed.
_RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
)


@contextlib.contextmanager
def _partial_reload_is_expected() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _RELOAD_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
