"""Runs inside vLLM's engine process: the worker extension that loads streamed weights into the model.

vLLM mixes this class into its worker class (engine argument ``worker_extension_cls``), which makes these
methods callable through ``AsyncLLM.collective_rpc``. The EngineCore runs utility calls between scheduler
steps, so no step sees half-updated weights. Tensors arrive validated and with every fused layer complete
(``weights.py``) and go through vLLM's in-place reload (``reload_weights`` with checkpoint-format tensors): it
maps checkpoint names onto vLLM's fused parameters and re-runs the per-layer processing (on CPU, vLLM repacks
linear weights for its GEMM kernels and drops the plain weight, so copying into parameters is not enough).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from .weights import WirePayload


class AgentloopWorkerExtension:
    """Extra worker methods (the ``agentloop_`` prefix keeps them clear of vLLM's own names)."""

    def agentloop_load_weights(self, payload: WirePayload) -> int:
        """Copy every tensor of ``payload`` into the model; return how many were given to the model."""
        weights = [(name, _tensor(dtype, shape, data)) for name, dtype, shape, data in payload]
        runner = self.model_runner  # type: ignore[attr-defined]  (the worker this class extends)
        with torch.no_grad(), _partial_reload_is_expected():
            runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        return len(weights)

    def agentloop_packed_modules(self) -> dict[str, list[str]]:
        """The model's fused parameters, e.g. ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}`` (a class
        attribute vLLM models declare for LoRA and quantization; models without fused layers have none)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return {fused: list(members) for fused, members in getattr(model, "packed_modules_mapping", {}).items()}


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
