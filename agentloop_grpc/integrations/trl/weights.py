"""A trainer model's parameters: which ones train, and the NamedTensors our weight update streams."""

from __future__ import annotations

from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.integrations.named_tensors import named_tensor


def model_tensors(model, trainable_only: bool = True) -> list[NamedTensor]:
    """Every parameter once (a tied parameter under its first name), as raw little-endian bytes; with
    ``trainable_only`` only those the optimizer can change (frozen ones are still the engines' own).

    The names are the model's own (``model.layers.0.self_attn.q_proj.weight``), which is what engines serving the
    same architecture expect.
    """
    return [named_tensor(name, parameter) for name, parameter in model.named_parameters()
            if parameter.requires_grad or not trainable_only]


def train_top_layers(model, top_layers: int | None) -> int:
    """Make the top ``top_layers`` decoder layers and the final norm trainable (every parameter when None);
    return the number of trainable parameters."""
    if top_layers is None:
        model.requires_grad_(True)
    else:
        model.requires_grad_(False)
        decoder = model.get_decoder()
        for layer in decoder.layers[-top_layers:]:
            layer.requires_grad_(True)
        decoder.norm.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
