"""Schema inference from typed functions, the calculator's parser, config validation."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest

from agentloop_grpc.tools.builtin.calculator import calculator
from agentloop_grpc.tools.config import ToolServerConfig, build_tools
from agentloop_grpc.tools.schema import function_schema


def search(query: str, limit: int = 5, fields: list[str] | None = None, mode: Literal["fast", "exact"] = "fast",
           weight: float = 1.0, strict: bool = False) -> str:
    """Search the corpus.

    Args:
        query: What to look for.
        limit: How many results.
    """
    return query


def test_schema_is_inferred_from_annotations_defaults_and_docstring() -> None:
    description, schema = function_schema(search)
    assert description == "Search the corpus."
    assert schema["required"] == ["query"]
    props = schema["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["limit"] == {"type": "integer", "description": "How many results.", "default": 5}
    list_of_strings = {"type": "array", "items": {"type": "string"}}
    assert props["fields"] == {"anyOf": [list_of_strings, {"type": "null"}], "default": None}
    assert props["mode"] == {"type": "string", "enum": ["fast", "exact"], "default": "fast"}
    assert props["weight"]["type"] == "number" and props["strict"]["type"] == "boolean"
    assert schema["additionalProperties"] is False


def test_unsupported_annotations_fail_at_start_up() -> None:
    def bad(x: dict) -> str:
        return ""

    def untyped(x) -> str:
        return ""

    with pytest.raises(TypeError, match="unsupported annotation"):
        function_schema(bad)
    with pytest.raises(TypeError, match="needs a type annotation"):
        function_schema(untyped)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [("(17 + 23) * 3", "120"), ("7 / 2", "3.5"), ("2 ** 100", str(2**100)), ("-5 % 3", "1"), ("10 // 4", "2"),
     ("1.5 * 2", "3")],
)
def test_calculator_is_exact(expression: str, expected: str) -> None:
    assert calculator(expression) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [("__import__('os').system('true')", "unsupported"), ("x + 1", "unsupported"), ("2 ** 99999", "exponent"),
     ("1 +", "not an arithmetic expression"), ("1 / 0", "division")],
)
def test_calculator_rejects_what_is_not_arithmetic(expression: str, message: str) -> None:
    with pytest.raises((ValueError, ZeroDivisionError), match=message):
        calculator(expression)


@pytest.mark.fault
def test_calculator_refuses_huge_results_before_computing_them() -> None:
    """Each exponent is within its bound, but the result would be gigabits: computing it held the GIL for minutes
    and froze the whole tool server. Run in a child process so the fault, were it back, ends in the timeout."""
    import subprocess
    import sys

    script = ("from agentloop_grpc.tools.builtin.calculator import calculator\n"
              "for e in ('((9**999)**999)**999', '(9**999) * (9**999) * (9**999) * (9**999)', '9.5 ** 999'):\n"
              "    try:\n        calculator(e)\n    except ValueError as error:\n        print(error)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and "more than 4096 bits" in lines[0] and "more than 4096 bits" in lines[1], result
    assert "overflows a float" in lines[2]
    assert calculator("9 ** 999") == str(9**999) and calculator("2 ** 1000 * 3") == str(2**1000 * 3)


def test_name_collision_is_a_start_up_error() -> None:
    config = ToolServerConfig.model_validate(
        {"tools": [{"function": "agentloop_grpc.tools.builtin.calculator:calculator"},
                   {"function": "agentloop_grpc.tools.builtin.calculator:calculator"}]}
    )
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        build_tools(config)


def test_entry_needs_exactly_one_kind() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ToolServerConfig.model_validate({"tools": [{"name": "x"}]})


def test_annotated_adds_json_schema_keywords():
    from agentloop_grpc.tools.schema import function_schema

    def f(code: Annotated[str, {"pattern": "^[0-9]+$", "maxLength": 5}], n: Annotated[int, {"minimum": 1}] = 1) -> str:
        """Do it."""
        return code * n

    _, schema = function_schema(f)
    assert schema["properties"]["code"] == {"type": "string", "pattern": "^[0-9]+$", "maxLength": 5}
    assert schema["properties"]["n"] == {"type": "integer", "minimum": 1, "default": 1}

    def g(code: Annotated[str, "not a dict"]) -> str:
        return code

    with pytest.raises(TypeError, match="Annotated metadata must be a dict"):
        function_schema(g)
