"""StandInSglEngine: a STAND-IN for ``sgl.Engine`` (tests only; SGLang's kernels need a GPU this machine lacks).

It has the surface the SGLang adapter's actor uses, with SGLang 0.5.23's names and signatures (cited in
``agentloop_grpc/engine_adapters/sglang/api.py``): ``async_generate(input_ids=..., sampling_params={...},
return_logprob=..., logprob_start_len=..., top_logprobs_num=..., stream=True, rid=...)`` streaming dicts shaped like
SGLang's (``output_ids`` and ``meta_info`` with ``output_token_logprobs`` / ``output_top_logprobs`` as
(logprob, id, text) tuples, cumulative unless ``incremental_streaming_output``; ``finish_reason`` dicts), and a
``tokenizer_manager`` with ``abort_request``, ``pause_generation``, ``continue_generation``, ``flush_cache``,
``release/resume_memory_occupation``, ``update_weights_from_tensor``, ``update_weights_from_disk``, ``get_loads``,
``config_value``, ``context_len``, ``model_config``, ``tokenizer``. Its request objects are stand-ins with SGLang's
field names.

Weights: the stand-in holds real float32 parameters (``parameter_shapes``). Both weight calls check every tensor
before copying any (SGLang's loaders are not that careful: see ``engine.py``), refuse an unknown name the way
SGLang's model ``load_weights`` does (a KeyError of the name in the message) and a shape that differs as its
``default_weight_loader`` assertion does, with the parameter's name added (SGLang's message has only the sizes).
``update_weights_from_disk`` reads a model folder as SGLang's ``DefaultModelLoader`` does with
``load_format="safetensors"``: its ``*.safetensors`` files, only those a ``model.safetensors.index.json`` names.
After each applied update the values held are reported as a ``weights`` call.

Images (``enable_multimodal``): as SGLang's processor does with ``input_ids`` and ``image_data``, every
``image_token_id`` in the ids is expanded to ``image_tokens`` ids, which ``prompt_tokens`` counts.

Prefix cache: blocks of 16 ids, each keyed by the request's ``cache_salt`` too (SGLang's radix-cache namespace).

Routed experts (``num_experts`` > 0 makes the model a MoE of ``ROUTING_LAYERS`` decoder layers, layer 1 dense, top
``ROUTING_TOP_K``, as ``tests/embedded/tiny_moe.py``; ``enable_return_routed_experts`` turns capture on): a request
with ``return_routed_experts`` gets, on its finished output only, ``meta_info["routed_experts"]`` as SGLang sends it,
base64 of int32 ``[prompt + output - 1, layers, top_k]`` with the dense layer's ids zero (``standin_routing``).

Tokens are a deterministic function of (seed, prompt, position) (greedy ignores the seed), so tests can check
exact streams. Every control call is reported to a ``CallRecorder`` actor, so a test can see what reached the
engine inside the rank-0 actor's process.
"""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import ray
import torch
from safetensors.torch import load_file

from agentloop_grpc.engine_adapters.sglang import SglangApi

_MASK = (1 << 63) - 1
_BLOCK = 16
ROUTING_LAYERS = 3
ROUTING_DENSE = (1,)
ROUTING_TOP_K = 2


@dataclass
class PauseGenerationReqInput:
    mode: str = "abort"


@dataclass
class ContinueGenerationReqInput:
    torch_empty_cache: bool = True


@dataclass
class ReleaseMemoryOccupationReqInput:
    tags: list[str] | None = None


@dataclass
class ResumeMemoryOccupationReqInput:
    tags: list[str] | None = None


@dataclass
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: list[bytes]
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


@dataclass
class UpdateWeightFromDiskReqInput:
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


@dataclass
class FlushCacheReqOutput:
    success: bool
    message: str = ""


@dataclass
class LoadSnapshot:
    num_running_reqs: int
    num_waiting_reqs: int
    token_usage: float
    cache_hit_rate: float
    max_running_requests: int


def standin_token(seed: int, prompt: list[int], position: int, vocab_size: int) -> tuple[int, float]:
    """The stand-in's token and logprob at ``position`` (tests compute expected streams with it)."""
    draw = hash((seed, tuple(prompt), position)) & _MASK
    return draw % vocab_size, -0.001 - (draw >> 40) % 8000 / 1000.0


def standin_routing(ids: list[int], num_experts: int) -> np.ndarray:
    """``[len(ids), ROUTING_LAYERS, ROUTING_TOP_K]`` int32: the stand-in's routing of each input position (row i is
    the forward whose input is ``ids[i]``, a function of ``ids[: i + 1]``); dense layers' ids are zero."""
    rows = np.zeros((len(ids), ROUTING_LAYERS, ROUTING_TOP_K), dtype=np.int32)
    for position in range(len(ids)):
        for layer in range(ROUTING_LAYERS):
            if layer not in ROUTING_DENSE:
                first = (hash((tuple(ids[: position + 1]), layer)) & _MASK) % num_experts
                rows[position, layer] = [(first + slot) % num_experts for slot in range(ROUTING_TOP_K)]
    return rows


class CallRecorder:
    """A Ray actor collecting what reached the stand-in engine: (method, payload) in arrival order."""

    def __init__(self) -> None:
        self._calls: list[tuple[str, Any]] = []

    def record(self, method: str, payload: Any) -> None:
        self._calls.append((method, payload))

    def calls(self) -> list[tuple[str, Any]]:
        return list(self._calls)

    def clear(self) -> None:
        self._calls.clear()


class _StandInTokenizer:
    def __init__(self, vocab_size: int) -> None:
        self._vocab = {f"t{i}": i for i in range(vocab_size)}
        self.all_special_tokens = ["t2"]

    def get_vocab(self) -> dict[str, int]:
        return self._vocab


@dataclass
class _Request:
    rid: str
    input_ids: list[int]
    params: dict[str, Any]
    seed: int
    cached_tokens: int
    cache_salt: str | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[tuple[float, int, None]] = field(default_factory=list)
    top: list[list[tuple[float, int, None]]] = field(default_factory=list)
    aborted: bool = False
    sent: int = 0
    routed: bool = False  # return_routed_experts, on an engine started with enable_return_routed_experts


class StandInTokenizerManager:
    """The TokenizerManager part of the stand-in (control calls)."""

    def __init__(self, engine: StandInSglEngine) -> None:
        self._engine = engine
        self.context_len = engine.context_len
        self.model_config = SimpleNamespace(
            vocab_size=engine.vocab_size, hf_eos_token_id={engine.eos_token_id}, is_multimodal=engine.multimodal,
            hf_config=SimpleNamespace(image_token_id=engine.image_token_id),
            hf_text_config=SimpleNamespace(  # SGLang's ModelConfig.hf_text_config: the Hugging Face config's fields
                num_hidden_layers=ROUTING_LAYERS, num_experts=engine.num_experts, mlp_only_layers=list(ROUTING_DENSE),
                decoder_sparse_step=1, num_experts_per_tok=ROUTING_TOP_K,
            ),
        )
        self.tokenizer = _StandInTokenizer(engine.vocab_size)

    def config_value(self, name: str) -> Any:
        return self._engine.server_args[name]

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self._engine.record("abort_request", {"rid": rid, "abort_all": abort_all})
        for request in self._engine.requests.values():
            if abort_all or request.rid == rid:
                request.aborted = True

    async def pause_generation(self, obj: PauseGenerationReqInput) -> None:
        self._engine.record("pause_generation", {"mode": obj.mode})
        self._engine.paused = obj.mode
        if obj.mode == "abort":
            self.abort_request(abort_all=True)
        self._engine.resumed.clear()

    async def continue_generation(self, obj: ContinueGenerationReqInput) -> None:
        self._engine.record("continue_generation", {})
        self._engine.paused = None
        self._engine.resumed.set()

    async def flush_cache(self) -> FlushCacheReqOutput:
        engine = self._engine
        if engine.paused == "in_place" and engine.requests:
            engine.record("flush_cache", {"success": False})
            return FlushCacheReqOutput(success=False, message="requests in the running batch")
        engine.record("flush_cache", {"success": True})
        engine.cache.clear()
        return FlushCacheReqOutput(success=True)

    async def release_memory_occupation(self, obj: ReleaseMemoryOccupationReqInput, request: Any = None) -> None:
        self._engine.record("release_memory_occupation", {"tags": obj.tags})
        self._engine.released.update(obj.tags or ("weights", "kv_cache"))
        self._engine.cache.clear()

    async def resume_memory_occupation(self, obj: ResumeMemoryOccupationReqInput, request: Any = None) -> None:
        self._engine.record("resume_memory_occupation", {"tags": obj.tags})
        self._engine.released.difference_update(obj.tags or ("weights", "kv_cache"))

    async def update_weights_from_tensor(self, obj: UpdateWeightsFromTensorReqInput, request: Any = None):
        engine = self._engine
        per_rank = [pickle.loads(payload) for payload in obj.serialized_named_tensors]
        named = per_rank[0]
        engine.record(
            "update_weights_from_tensor",
            {
                "ranks": len(per_rank),
                "flush_cache": obj.flush_cache,
                "weight_version": obj.weight_version,
                "tensors": [(name, str(t.dtype), tuple(t.shape), t.flatten().tolist()) for name, t in named],
            },
        )
        return engine.load(named, obj.flush_cache)

    async def update_weights_from_disk(self, obj: UpdateWeightFromDiskReqInput, request: Any = None):
        engine = self._engine
        folder = Path(obj.model_path)
        engine.record("update_weights_from_disk", {
            "model_path": obj.model_path, "load_format": obj.load_format, "flush_cache": obj.flush_cache,
            "weight_version": obj.weight_version,
        })
        if not folder.is_dir():  # SGLang would try the Hugging Face hub for a name that is not a local folder
            return False, f"Failed to get weights iterator: {obj.model_path} is not a local model folder.", 0
        files = sorted(folder.glob("*.safetensors"))
        index = folder / "model.safetensors.index.json"
        if index.exists():
            listed = set(json.loads(index.read_text())["weight_map"].values())
            files = [file for file in files if file.name in listed]
        named = [pair for file in files for pair in load_file(str(file)).items()]
        success, message = engine.load(named, obj.flush_cache)
        return success, message, 0

    async def get_loads(self, include: list[str] | None = None, dp_rank: int | None = None) -> list[LoadSnapshot]:
        engine = self._engine
        running = len(engine.requests)
        return [LoadSnapshot(running, 0, min(1.0, running / engine.max_running), 0.0, engine.max_running)]


class StandInSglEngine:
    """The stand-in engine (see module docstring); kwargs are a few of SGLang's server arguments."""

    def __init__(
        self,
        model_path: str = "standin/model",
        tp_size: int = 1,
        vocab_size: int = 32_000,
        context_len: int = 4096,
        eos_token_id: int = 2,
        token_latency_s: float = 0.002,
        enable_memory_saver: bool = True,
        incremental_streaming_output: bool = False,
        max_running_requests: int = 512,
        parameter_shapes: dict[str, tuple[int, ...]] | None = None,
        recorder: ray.actor.ActorHandle | None = None,
        enable_multimodal: bool = False,
        image_token_id: int = 31_999,
        image_tokens: int = 3,
        num_experts: int = 0,
        enable_return_routed_experts: bool = False,
    ) -> None:
        self.vocab_size, self.context_len, self.eos_token_id = vocab_size, context_len, eos_token_id
        self.multimodal, self.image_token_id, self.image_tokens = enable_multimodal, image_token_id, image_tokens
        self.token_latency_s = token_latency_s
        self.incremental = incremental_streaming_output
        self.max_running = max_running_requests
        shapes = parameter_shapes or {"model.norm.weight": (2, 2)}
        self.weights = {name: torch.zeros(shape, dtype=torch.float32) for name, shape in shapes.items()}
        self.num_experts = num_experts
        self.server_args = {"enable_memory_saver": enable_memory_saver, "tp_size": tp_size, "model_path": model_path,
                            "enable_return_routed_experts": enable_return_routed_experts}
        self.recorder = recorder
        self.requests: dict[str, _Request] = {}
        self.cache: set[int] = set()
        self.released: set[str] = set()
        self.paused: str | None = None
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.tokenizer_manager = StandInTokenizerManager(self)

    def record(self, method: str, payload: Any) -> None:
        if self.recorder is not None:
            self.recorder.record.remote(method, payload)

    def shutdown(self) -> None:
        self.record("shutdown", {})

    def load(self, named: list[tuple[str, torch.Tensor]], flush_cache: bool) -> tuple[bool, str]:
        """Copy ``named`` into the parameters, all or none; SGLang's (success, message)."""
        for name, value in named:
            if name not in self.weights:
                return False, f"Failed to update weights: {name!r}.\nRolling back to original weights."
            if value.shape != self.weights[name].shape:
                return False, (f"Failed to update weights: {name}: Attempted to load weight ({value.size()}) into "
                               f"parameter ({self.weights[name].size()}).\nRolling back to original weights.")
        for name, value in named:
            self.weights[name].copy_(value)
        if flush_cache:
            self.cache.clear()
        self.record("weights", {name: value.flatten().tolist() for name, value in self.weights.items()})
        return True, "Succeeded to update model weights."

    async def async_generate(
        self,
        prompt: Any = None,
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
        rid: str | None = None,
        image_data: list[str] | None = None,
        *,
        cache_salt: str | None = None,
        return_routed_experts: bool = False,
        **unused: Any,
    ):
        params = dict(sampling_params or {})
        self.record(
            "async_generate",
            {"rid": rid, "input_ids": list(input_ids), "sampling_params": params, "return_logprob": return_logprob,
             "top_logprobs_num": top_logprobs_num, "logprob_start_len": logprob_start_len, "stream": stream,
             "image_data": image_data, "cache_salt": cache_salt, "return_routed_experts": return_routed_experts},
        )
        if image_data:
            expanded = [[t] * self.image_tokens if t == self.image_token_id else [t] for t in input_ids]
            input_ids = [t for ids in expanded for t in ids]
        if not stream:
            raise NotImplementedError("the stand-in streams only (the adapter always streams)")
        if "%unsupported" in params.get("ebnf", ""):  # what SGLang does with a grammar its backend refuses
            return self._rejected(rid, len(input_ids))
        greedy = params.get("temperature", 1.0) == 0.0
        seed = 0 if greedy else params.get("sampling_seed", random.getrandbits(62))
        request = _Request(rid, list(input_ids), params, seed, self._cached(input_ids, cache_salt), cache_salt,
                           routed=return_routed_experts and self.server_args["enable_return_routed_experts"])
        return self._run(request, return_logprob, top_logprobs_num or 0)

    async def _rejected(self, rid: str | None, prompt_tokens: int):
        finish = {"type": "abort", "message": "Failed to compile the EBNF grammar", "status_code": 400}
        yield {"text": "", "output_ids": [], "meta_info": {"id": rid, "finish_reason": finish,
                                                        "prompt_tokens": prompt_tokens, "completion_tokens": 0,
                                                        "cached_tokens": 0}}

    def _cached(self, input_ids: list[int], cache_salt: str | None) -> int:
        """Prompt tokens the cache holds; as SGLang's radix tree, a prefix is matched only under its own salt."""
        blocks = 0
        for end in range(_BLOCK, len(input_ids), _BLOCK):
            if hash((cache_salt, tuple(input_ids[:end]))) not in self.cache:
                break
            blocks += 1
        return blocks * _BLOCK

    def _remember(self, tokens: list[int], cache_salt: str | None) -> None:
        for end in range(_BLOCK, len(tokens) + 1, _BLOCK):
            self.cache.add(hash((cache_salt, tuple(tokens[:end]))))

    async def _run(self, request: _Request, return_logprob: bool, top_n: int):
        self.requests[request.rid] = request
        try:
            while True:
                await asyncio.sleep(self.token_latency_s)
                while self.paused is not None and not request.aborted:
                    await self.resumed.wait()
                if request.aborted:
                    self._finish(request)
                    aborted = {"type": "abort", "message": "Abort in waiting queue", "status_code": None}
                    yield self._output(request, aborted)
                    return
                finish = self._decode(request, top_n)
                if finish is not None:
                    self._finish(request)  # as SGLang's scheduler: cached and freed before the finish is streamed
                yield self._output(request, finish, return_logprob)
                if finish is not None:
                    return
        finally:
            self._finish(request)

    def _finish(self, request: _Request) -> None:
        if self.requests.pop(request.rid, None) is not None:
            self._remember(request.input_ids + request.output_ids, request.cache_salt)

    def _decode(self, request: _Request, top_n: int) -> dict | None:
        position = len(request.output_ids)
        token, logprob = standin_token(request.seed, request.input_ids, position, self.vocab_size)
        request.output_ids.append(token)
        request.logprobs.append((logprob, token, None))
        request.top.append([(logprob - 0.5 * j, (token + j) % self.vocab_size, None) for j in range(top_n)])
        params = request.params
        if token in params.get("stop_token_ids", ()) or (token == self.eos_token_id and not params.get("ignore_eos")):
            return {"type": "stop", "matched": token}
        if len(request.output_ids) >= params.get("max_new_tokens", 128):
            return {"type": "length", "length": len(request.output_ids)}
        return None

    def _output(self, request: _Request, finish: dict | None, return_logprob: bool = False) -> dict:
        count = len(request.output_ids)
        start = request.sent if self.incremental else 0  # incremental_streaming_output: only the new part
        request.sent = count
        meta: dict[str, Any] = {
            "id": request.rid,
            "finish_reason": finish,
            "prompt_tokens": len(request.input_ids),
            "completion_tokens": count,
            "cached_tokens": request.cached_tokens,
            "weight_version": "default",
        }
        if return_logprob:
            meta["output_token_logprobs"] = request.logprobs[start:]
            meta["output_top_logprobs"] = request.top[start:]
        if finish is not None and request.routed and count:  # SGLang collects it when the request finishes
            routes = standin_routing(request.input_ids + request.output_ids[:-1], self.num_experts)
            meta["routed_experts"] = base64.b64encode(routes.tobytes()).decode("utf-8")
        return {"text": None, "output_ids": request.output_ids[start:], "meta_info": meta}


STANDIN_API = SglangApi(
    version="0.5.23 (stand-in)",
    engine_class=StandInSglEngine,
    pause_request=PauseGenerationReqInput,
    continue_request=ContinueGenerationReqInput,
    release_memory_request=ReleaseMemoryOccupationReqInput,
    resume_memory_request=ResumeMemoryOccupationReqInput,
    update_weights_request=UpdateWeightsFromTensorReqInput,
    update_disk_request=UpdateWeightFromDiskReqInput,
    serialize_tensors=pickle.dumps,
)
