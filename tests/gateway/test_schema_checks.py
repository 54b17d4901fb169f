"""Tool schemas are compiled once per distinct schema (an agent sends its tools with every turn): the same schema
again skips jsonschema's check, another schema or a bad one is checked (a bad one refused every time), and the
memory is bounded."""

from __future__ import annotations

from typing import Any

import pytest

from agentloop_grpc.gateway import wire_checks
from agentloop_grpc.gateway.anthropic_messages import ANTHROPIC_MESSAGES
from agentloop_grpc.gateway.config import GatewayLimits
from agentloop_grpc.gateway.exchange import GatewayError
from agentloop_grpc.gateway.openai_chat import OPENAI_CHAT
from agentloop_grpc.gateway.openai_responses import OPENAI_RESPONSES
from agentloop_grpc.gateway.wire_checks import SchemaChecks

LIMITS = GatewayLimits()
SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}


def _chat(schema: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "calculator", "parameters": schema}}]}


@pytest.fixture
def compiled(monkeypatch) -> list[dict]:
    """The schemas jsonschema was asked to check, in order."""
    seen: list[dict] = []
    real = wire_checks.validator_for

    def counting(schema, default=None):
        seen.append(schema)
        return real(schema, default=default)

    monkeypatch.setattr(wire_checks, "validator_for", counting)
    return seen


def test_the_same_schema_is_compiled_once(compiled):
    checks = SchemaChecks()
    for _ in range(3):
        OPENAI_CHAT.parse(_chat(SCHEMA), LIMITS, checks)
    assert len(compiled) == 1
    OPENAI_CHAT.parse(_chat({**SCHEMA, "required": []}), LIMITS, checks)  # another schema: checked
    assert len(compiled) == 2
    OPENAI_CHAT.parse(_chat(dict(reversed(SCHEMA.items()))), LIMITS, checks)  # the same, its keys reordered
    assert len(compiled) == 2
    OPENAI_CHAT.parse(_chat(SCHEMA), LIMITS)  # without checks: every time
    assert len(compiled) == 3


def test_a_bad_schema_is_refused_every_time(compiled):
    checks = SchemaChecks()
    bad = {"type": "object", "properties": {"x": {"type": 12}}}
    for _ in range(2):
        with pytest.raises(GatewayError, match="not a valid JSON Schema") as refused:
            OPENAI_CHAT.parse(_chat(bad), LIMITS, checks)
        assert refused.value.param == "tools[0].function.parameters"
    assert len(compiled) == 2


def test_every_format_uses_the_checks(compiled):
    checks = SchemaChecks()
    messages = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "calculator", "input_schema": SCHEMA}]}
    responses = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "calculator",
                                                          "parameters": SCHEMA}]}
    for _ in range(2):
        ANTHROPIC_MESSAGES.parse(messages, LIMITS, checks)
        OPENAI_RESPONSES.parse(responses, LIMITS, checks)
        OPENAI_CHAT.parse(_chat(SCHEMA), LIMITS, checks)
    assert len(compiled) == 1


def test_the_memory_is_bounded(compiled):
    checks = SchemaChecks(size=2)
    schemas = [{**SCHEMA, "description": str(i)} for i in range(3)]
    for schema in schemas:
        OPENAI_CHAT.parse(_chat(schema), LIMITS, checks)
    OPENAI_CHAT.parse(_chat(schemas[0]), LIMITS, checks)  # the oldest was forgotten: checked again
    OPENAI_CHAT.parse(_chat(schemas[2]), LIMITS, checks)  # the newest was kept
    assert len(compiled) == 4
