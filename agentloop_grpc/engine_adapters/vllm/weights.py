"""UpdateWeights for vLLM: validate the streamed tensors here, load them in the engine process.

vLLM's model lives in the EngineCore process, so the adapter cannot check tensors against live parameters the
way the embedded engine does. It checks them against the served checkpoint instead (names, shapes and dtypes
from the safetensors headers, floating-point dtypes as served), before anything is sent: a bad update changes
nothing. The accepted names are the checkpoint's (Hugging Face) names; vLLM's reload maps them onto its fused
parameters (q/k/v -> qkv_proj, gate/up -> gate_up_proj) in the engine process (``worker.py``). With tied
embeddings ``lm_head.weight`` is accepted as the embedding it is tied to.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.types import NamedTensor

# safetensors dtype codes -> our dtype names (types.NamedTensor.dtype)
_SAFETENSORS_DTYPES = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
_FLOATING = {"float32", "float16", "bfloat16", "float64"}
_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int8": 1, "uint8": 1}
_TIED_ALIASES = {"lm_head.weight": "model.embed_tokens.weight"}

#: What crosses to the engine process: (name, dtype, shape, bytes) per tensor (plain msgpack-able values).
WirePayload = list[tuple[str, str, list[int], bytes]]


@dataclass(frozen=True, slots=True)
class ParameterSpec:
    dtype: str
    shape: tuple[int, ...]


def _header(path: Path) -> dict:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))


class CheckpointWeights:
    """The served checkpoint's parameter names and specs, and the current value of every tensor that shares a
    fused vLLM parameter with others.

    On CPU vLLM repacks every linear weight for its GEMM kernels after loading, so an update goes through vLLM's
    layer-wise reload, which rebuilds a layer from *all* of its checkpoint tensors. A fused layer (q/k/v ->
    qkv_proj, gate/up -> gate_up_proj: the model's ``packed_modules_mapping``) is therefore always sent whole:
    ``complete`` adds the current value of the siblings an update does not name, from earlier updates
    (``commit``) or from the checkpoint file.
    """

    def __init__(self, folder: Path, served_dtype: str, tied_embeddings: bool) -> None:
        self.served_dtype = served_dtype
        self.tied_embeddings = tied_embeddings
        self.specs: dict[str, ParameterSpec] = {}
        self._files: dict[str, Path] = {}
        for path in sorted(folder.glob("*.safetensors")):
            for name, entry in _header(path).items():
                if name == "__metadata__":
                    continue
                dtype = _SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"].lower())
                self.specs[name] = ParameterSpec(served_dtype if dtype in _FLOATING else dtype, tuple(entry["shape"]))
                self._files[name] = path
        if tied_embeddings:
            for alias, target in _TIED_ALIASES.items():
                if alias not in self.specs and target in self.specs:
                    self.specs[alias] = self.specs[target]
        self._current: dict[str, bytes] = {}  # updated tensors of fused layers (the file holds the others)

    def stage(self, tensors: Sequence[NamedTensor]) -> WirePayload:
        """Validate every tensor; return the payload for the engine process. Raise InvalidRequestError naming the
        first bad tensor."""
        payload: WirePayload = []
        targets: set[str] = set()
        for tensor in tensors:
            spec = self.specs.get(tensor.name)
            if spec is None:
                raise InvalidRequestError(f"tensor {tensor.name!r} is not a parameter of the model")
            if tensor.dtype != spec.dtype:
                raise InvalidRequestError(
                    f"tensor {tensor.name!r}: dtype {tensor.dtype} does not match the parameter's {spec.dtype}"
                )
            if tuple(tensor.shape) != spec.shape:
                raise InvalidRequestError(
                    f"tensor {tensor.name!r}: shape {list(tensor.shape)} does not match the parameter's "
                    f"{list(spec.shape)}"
                )
            expected = math.prod(tensor.shape) * _ITEM_BYTES.get(tensor.dtype, 1)
            if len(tensor.data) != expected:
                raise InvalidRequestError(f"tensor {tensor.name!r}: {len(tensor.data)} bytes, expected {expected}")
            target = _TIED_ALIASES.get(tensor.name, tensor.name) if self.tied_embeddings else tensor.name
            if target in targets:
                raise InvalidRequestError(f"tensor {tensor.name!r} updates {target!r}, which this update already sets")
            targets.add(target)
            payload.append((target, tensor.dtype, list(tensor.shape), tensor.data))
        return payload

    def complete(self, payload: WirePayload, packed: dict[str, list[str]]) -> WirePayload:
        """``payload`` plus the current value of every fused sibling it does not name."""
        named = {name for name, *_ in payload}
        extra: WirePayload = []
        for name in list(named):
            for sibling in _siblings(name, packed):
                if sibling in self.specs and sibling not in named:
                    named.add(sibling)
                    spec = self.specs[sibling]
                    extra.append((sibling, spec.dtype, list(spec.shape), self._value(sibling)))
        return payload + extra

    def commit(self, payload: WirePayload, packed: dict[str, list[str]]) -> None:
        """Remember the applied values of fused tensors (what ``complete`` sends for them next time)."""
        fused = {member for members in packed.values() for member in members}
        for name, _, _, data in payload:
            if _module(name) in fused:
                self._current[name] = data

    def _value(self, name: str) -> bytes:
        if name in self._current:
            return self._current[name]
        with safe_open(str(self._files[name]), framework="pt") as checkpoint:
            tensor = checkpoint.get_tensor(name)
        if tensor.is_floating_point():
            tensor = tensor.to(getattr(torch, self.served_dtype))
        return tensor.contiguous().view(torch.uint8).numpy().tobytes()


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
