"""A trainer's tensor as the NamedTensor our weight updates carry: raw little-endian bytes of a contiguous CPU
copy. bfloat16 has no numpy dtype, so its bytes are taken from a same-sized integer view."""

from __future__ import annotations

from agentloop_grpc.common.types import NamedTensor


def named_tensor(name: str, tensor) -> NamedTensor:
    import torch

    data = tensor.detach().contiguous().cpu()
    raw = data.view(torch.int16) if data.dtype == torch.bfloat16 else data
    return NamedTensor(name, str(data.dtype).removeprefix("torch."), tuple(data.shape), raw.numpy().tobytes())
