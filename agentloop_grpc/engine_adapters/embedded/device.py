"""The torch device the embedded engine runs on, checked once when it starts.

The weights, the KV slots and the prefix cache's blocks live there; the per-request state (samplers with their own
generators, penalties, grammar masks) stays on the host, and each step brings its logits back once. A GPU engine
runs eagerly (no CUDA graphs): a decode step's batch size and KV length change every step.
"""

from __future__ import annotations

import torch


def placement(name: str) -> torch.device:
    """The device ``name`` (cpu, cuda, cuda:N) names; ValueError when this machine has no such device."""
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: this machine has no usable CUDA GPU (torch {torch.__version__}, "
                         f"torch.cuda.is_available() is False)")
    count = torch.cuda.device_count()
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= count:
        raise ValueError(f"device {name!r}: this machine has {count} CUDA GPU(s)")
    return torch.device("cuda", index)
