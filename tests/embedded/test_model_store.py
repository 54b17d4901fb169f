"""The default model is prepared offline once, and its chat template renders Hermes-style tools."""

from __future__ import annotations

import json

from agentloop_grpc.common import model_store


def test_prepare_is_idempotent_and_offline(checkpoint) -> None:
    assert model_store.is_checkpoint(checkpoint)
    assert model_store.prepare() == checkpoint
    assert model_store.resolve(str(checkpoint)) == checkpoint
    config = json.loads((checkpoint / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"


def test_chat_template_renders_tools_calls_and_responses(tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc", "arguments": {"x": "2+3"}}}]},
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "ok"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n")
    assert "<tools>\n" + json.dumps(tools[0]) + "\n</tools>" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": {"x": "2+3"}}\n</tool_call><|im_end|>'
        in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>"
        in text
    )
    assert text.endswith("<|im_start|>assistant\n")
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    default_system = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    )
    assert plain == default_system + "<|im_start|>user\nHi<|im_end|>\n"  # as the model's own template
