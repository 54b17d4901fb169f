"""The trainer boundary (padded tensors), Parquet round trip, trajectory validation, parser and truncation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentloop_grpc.agent import HermesParser, Termination, Trajectory, read_parquet, to_batch, write_parquet
from agentloop_grpc.agent.trajectory import Drift, Timings
from agentloop_grpc.agent.truncation import truncate


def _trajectory(sample_id: str, prompt, response, mask, reward=1.0, **extra) -> Trajectory:
    logprobs = tuple(-0.5 if m else 0.0 for m in mask)
    versions = tuple(3 if m else -1 for m in mask)
    return Trajectory(sample_id=sample_id, loop="tool", prompt_ids=tuple(prompt), response_ids=tuple(response),
                      response_mask=tuple(mask), response_logprobs=logprobs, weight_versions=versions,
                      reward=reward, termination=extra.pop("termination", Termination.STOP), **extra)


def test_to_batch_pads_prompts_left_and_responses_right():
    a = _trajectory("a", [5, 6, 7], [8, 9, 10, 11], [1, 1, 0, 1], reward=2.0)
    b = _trajectory("b", [5], [8], [1], reward=-1.0)
    failed = _trajectory("c", [1], [], [], reward=0.0, termination=Termination.ERROR, error="x")
    batch = to_batch([a, b, failed], pad_token_id=0)
    t = batch.tensors
    assert batch.sample_ids == ("a", "b") and batch.excluded == ("c",)
    assert t["prompts"].tolist() == [[5, 6, 7], [0, 0, 5]]
    assert t["responses"].tolist() == [[8, 9, 10, 11], [8, 0, 0, 0]]
    assert t["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1, 1]]
    assert t["response_mask"].tolist() == [[1, 1, 0, 1], [1, 0, 0, 0]]
    assert t["rollout_log_probs"].tolist() == [[-0.5, -0.5, 0.0, -0.5], [-0.5, 0.0, 0.0, 0.0]]
    assert t["token_level_rewards"].tolist() == [[0, 0, 0, 2.0], [-1.0, 0, 0, 0]]
    assert t["weight_versions"].tolist() == [[3, 3, -1, 3], [3, -1, -1, -1]]
    assert t["input_ids"].dtype == torch.long and t["rewards"].tolist() == [2.0, -1.0]
    wider = to_batch([a, b], pad_token_id=0, prompt_length=5, response_length=6).tensors
    assert wider["prompts"].shape == (2, 5) and wider["responses"].shape == (2, 6)
    with pytest.raises(ValueError, match="does not fit"):
        to_batch([a], pad_token_id=0, prompt_length=2)


def test_to_batch_saves_and_loads(tmp_path):
    batch = to_batch([_trajectory("a", [1, 2], [3], [1])], pad_token_id=0)
    batch.save(tmp_path / "batch.pt")
    loaded = torch.load(tmp_path / "batch.pt")
    assert loaded["sample_ids"] == ["a"] and torch.equal(loaded["tensors"]["input_ids"], batch.tensors["input_ids"])


def test_parquet_round_trip(tmp_path):
    original = [
        _trajectory("a", [1, 2], [3, 4, 5], [1, 0, 1], messages=({"role": "user", "content": "hi"},),
                    drift=Drift(4, 7, 8), timings=Timings(generate_s=1.5, total_s=2.0), servers=("h:1",),
                    metrics={"reward_tools": 1.0}, tool_rewards=(0.0, 1.0)),
        _trajectory("b", [1], [], [], termination=Termination.ERROR, error="boom", infrastructure_failure=True),
    ]
    path = write_parquet(original, tmp_path / "t.parquet")
    assert read_parquet(path) == original


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"response_logprobs": (-0.1,)}, "same length"),
        ({"response_mask": (2, 1)}, "not 0 or 1"),
        ({"response_logprobs": (-0.1, -0.2), "response_mask": (0, 1)}, "not a model token"),
        ({"weight_versions": (-1, 0)}, "no version"),
        ({"error": "x"}, "termination ERROR"),
    ],
)
def test_trajectory_refuses_misaligned_records(change, message):
    good = _trajectory("a", [1], [2, 3], [1, 1])
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(good, **change)


def test_hermes_parser():
    parser = HermesParser()
    parsed = parser.parse(
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>\n'
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>[1]</tool_call>'
        '<tool_call>{"name": "g", "arguments": 3}</tool_call> tail <tool_call>{"name"'
    )
    assert parsed.content == "Let me compute.\n\n tail"
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calculator", {"expression": "1+1"}), ("f", {"x": 1})]
    assert [e.reason for e in parsed.errors] == [
        'the call must be a JSON object with a string "name"',
        '"arguments" must be a JSON object',
        "a <tool_call> block is not closed with </tool_call>",
    ]
    assert parser.parse("just text").calls == () and parser.parse("just text").content == "just text"


def test_call_grammar_accepts_valid_calls_and_rejects_others(codec):
    import xgrammar

    from agentloop_grpc.tools.builtin.calculator import calculator
    from agentloop_grpc.tools.tool import FunctionTool

    grammar = HermesParser().constraint([FunctionTool(calculator).spec.openai()], max_calls=2)
    info = xgrammar.TokenizerInfo.from_huggingface(codec.tokenizer, vocab_size=49152)
    compiled = xgrammar.GrammarCompiler(info).compile_grammar(grammar)

    def accepts(text: str) -> bool:
        matcher = xgrammar.GrammarMatcher(compiled)
        return all(matcher.accept_token(t) for t in codec.encode(text)) and matcher.accept_token(2)

    one = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
    assert accepts(one) and accepts(one + "\n" + one)
    assert not accepts(one + "\n" + one + "\n" + one)  # max_calls
    assert not accepts(one.replace("calculator", "shell"))  # only offered tools
    assert not accepts("The answer is 3.")
    with pytest.raises(ValueError, match="at least one tool"):
        HermesParser().constraint([], 1)


@pytest.mark.parametrize(
    ("side", "expected"), [("right", "abcd...(truncated)..."), ("left", "...(truncated)...wxyz"),
                           ("middle", "ab...(truncated)...yz")]
)
def test_truncate(side, expected):
    text = "abcdefghijklmnopqrstuvwxyz"
    assert truncate(text, 21, side) == expected and len(expected) == 21
    assert truncate(text, 26, side) == text


@pytest.mark.fault
def test_a_call_nested_past_the_decoder_is_a_malformed_call_not_a_crash():
    """RecursionError (100,000 brackets) and the int digit limit escaped the parser and failed the trajectory."""
    parser = HermesParser()
    for body in ("[" * 100_000, '{"name": "c", "arguments": ' + '{"a": ' * 5_000 + "1" + "}" * 5_001,
                 '{"name": "c", "arguments": {"n": ' + "9" * 5_000 + "}}"):
        turn = parser.parse(f"<tool_call>\n{body}\n</tool_call>")
        assert not turn.calls and len(turn.errors) == 1, body[:40]
        assert "nested too deeply or holds a number too long" in turn.errors[0].reason
