"""Weight updates for vLLM: checked here against the served checkpoint, loaded in the engine process.

vLLM's model lives in the EngineCore process, so the adapter cannot check tensors against live parameters the
way the embedded engine does. It checks them against the served checkpoint instead (names, shapes and dtypes
from the safetensors headers, floating-point dtypes as served), before anything moves: a bad update changes
nothing. This holds for every transport: streamed tensors (``stage``), tensors a weight group announces
(``check``) and a checkpoint the engine process reads itself (``check_checkpoint``, headers only). The accepted
names are the checkpoint's (Hugging Face) names; vLLM's reload maps them onto its fused parameters (q/k/v ->
qkv_proj, gate/up -> gate_up_proj) in the engine process, where ``FusedLayers`` completes each fused layer
(``worker.py``). With tied embeddings ``lm_head.weight`` is accepted as the embedding it is tied to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.safetensors_format import SAFETENSORS_DTYPES
from agentloop_grpc.common.types import NamedTensor

from ..checkpoint import checkpoint_entries, read_header

_FLOATING = {"float32", "float16", "bfloat16", "float64"}
_ITEM_BYTES = dict(SAFETENSORS_DTYPES.values())
_TIED_ALIASES = {"lm_head.weight": "model.embed_tokens.weight"}

#: Streamed tensors for the engine process: (name, dtype, shape, bytes) per tensor (plain msgpack-able values).
WirePayload = list[tuple[str, str, list[int], bytes]]
#: A checkpoint for the engine process to read: per file, its (tensor name, model name) pairs.
CheckpointPlan = list[tuple[str, list[tuple[str, str]]]]


@dataclass(frozen=True, slots=True)
class ParameterSpec:
    dtype: str
    shape: tuple[int, ...]


def _dtype_name(code: str) -> str:
    return SAFETENSORS_DTYPES[code][0] if code in SAFETENSORS_DTYPES else code.lower()


def checkpoint_tensor_files(folder: Path) -> dict[str, Path]:
    """The file of every tensor of the checkpoint in ``folder``."""
    return {
        name: path
        for path in sorted(folder.glob("*.safetensors"))
        for name in read_header(path)
    }


class CheckpointWeights:
    """The served checkpoint's parameter names and specs (from its safetensors headers)."""

    def __init__(self, folder: Path, served_dtype: str, tied_embeddings: bool) -> None:
        self.served_dtype = served_dtype
        self.tied_embeddings = tied_embeddings
        self.specs: dict[str, ParameterSpec] = {}
        for path in sorted(folder.glob("*.safetensors")):
            for name, entry in read_header(path).items():
                dtype = _dtype_name(entry["dtype"])
                self.specs[name] = ParameterSpec(served_dtype if dtype in _FLOATING else dtype, tuple(entry["shape"]))
        if tied_embeddings:
            for alias, target in _TIED_ALIASES.items():
                if alias not in self.specs and target in self.specs:
                    self.specs[alias] = self.specs[target]

    def check(self, tensors: Iterable[tuple[str, str, Sequence[int]]]) -> list[str]:
        """The model name each (name, dtype, shape) updates; InvalidRequestError names the first bad tensor."""
        targets: list[str] = []
        for name, dtype, shape in tensors:
            spec = self.specs.get(name)
            if spec is None:
                raise InvalidRequestError(f"tensor {name!r} is not a parameter of the model")
            if dtype != spec.dtype:
                raise InvalidRequestError(f"tensor {name!r}: dtype {dtype} does not match the parameter's {spec.dtype}")
            if tuple(shape) != spec.shape:
                raise InvalidRequestError(
                    f"tensor {name!r}: shape {list(shape)} does not match the parameter's {list(spec.shape)}"
                )
            target = _TIED_ALIASES.get(name, name) if self.tied_embeddings else name
            if target in targets:
                raise InvalidRequestError(f"tensor {name!r} updates {target!r}, which this update already sets")
            targets.append(target)
        return targets

    def stage(self, tensors: Sequence[NamedTensor]) -> WirePayload:
        """Check streamed tensors; return the payload for the engine process."""
        targets = self.check((t.name, t.dtype, t.shape) for t in tensors)
        for tensor in tensors:
            expected = math.prod(tensor.shape) * _ITEM_BYTES.get(tensor.dtype, 1)
            if len(tensor.data) != expected:
                raise InvalidRequestError(f"tensor {tensor.name!r}: {len(tensor.data)} bytes, expected {expected}")
        return [(target, t.dtype, list(t.shape), t.data) for target, t in zip(targets, tensors)]

    def check_checkpoint(self, path: str) -> tuple[CheckpointPlan, int, int]:
        """Check the checkpoint at ``path`` from its headers alone; return what the engine process reads, the
        tensor count and their bytes. InvalidRequestError names the path or the first bad tensor."""
        entries = checkpoint_entries(path)
        targets = self.check((spec.name, spec.dtype, spec.shape) for _, spec in entries)
        plan: dict[str, list[tuple[str, str]]] = {}
        for (file, spec), target in zip(entries, targets):
            plan.setdefault(str(file), []).append((spec.name, target))
        return list(plan.items()), len(entries), sum(spec.nbytes for _, spec in entries)

class FusedLayers:
    """Runs in the engine process: the current value of every tensor that shares a fused vLLM parameter.

    On CPU vLLM repacks every linear weight for its GEMM kernels after loading, so an update goes through vLLM's
    layer-wise reload, which rebuilds a layer from *all* of its checkpoint tensors. A fused layer (q/k/v ->
    qkv_proj, gate/up -> gate_up_proj: the model's ``packed_modules_mapping``) is therefore always loaded whole:
    ``complete`` adds the current value of the siblings an update does not name, from earlier updates
    (``commit``) or from the checkpoint file.
    """

    def __init__(self, folder: Path, served_dtype: torch.dtype, packed: dict[str, list[str]]) -> None:
        self.served_dtype = served_dtype
        self.packed = packed
        self._files = checkpoint_tensor_files(folder)
        self._current: dict[str, torch.Tensor] = {}  # updated tensors of fused layers (the file holds the others)

    def complete(self, weights: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """``weights`` plus the current value of every fused sibling they do not name."""
        named = {name for name, _ in weights}
        extra: list[tuple[str, torch.Tensor]] = []
        for name, _ in weights:
            for sibling in _siblings(name, self.packed):
                if sibling in self._files and sibling not in named:
                    named.add(sibling)
                    extra.append((sibling, self._value(sibling)))
        return weights + extra

    def commit(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """Remember the applied values of fused tensors (copies: the given ones may be views of a buffer)."""
        fused = {member for members in self.packed.values() for member in members}
        for name, tensor in weights:
            if _module(name) in fused:
                self._current[name] = tensor.clone()

    def _value(self, name: str) -> torch.Tensor:
        if name in self._current:
            return self._current[name]
        with safe_open(str(self._files[name]), framework="pt") as checkpoint:
            tensor = checkpoint.get_tensor(name)
        return tensor.to(self.served_dtype) if tensor.is_floating_point() else tensor


def _module(name: str) -> str:
    """The module a parameter belongs to, e.g. ``q_proj`` for ``model.layers.0.self_attn.q_proj.weight``."""
    parts = name.split(".")
    return parts[-2] if len(parts) >= 2 else ""


def _siblings(name: str, packed: dict[str, list[str]]) -> list[str]:
    """Checkpoint names fused with ``name`` into one vLLM parameter (same parent module, same parameter)."""
    parts = name.split(".")
    if len(parts) < 2:
        return []
    parent, module, param = parts[:-2], parts[-2], parts[-1]
    for members in packed.values():
        if module in members:
            return [".".join([*parent, other, param]) for other in members if other != module]
    return []
