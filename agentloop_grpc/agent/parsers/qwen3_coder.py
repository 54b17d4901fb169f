"""Qwen3-Coder: XML-style calls whose parameter values are typed by the tool's JSON schema.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A value is raw text (one newline after the opening tag and before the closing one belongs to the format). A
parameter the schema types as a string stays text; any other type is read as JSON and must be of that type, so
``3`` is the integer 3 for ``days`` but the text "3" for a string. The parser needs the tools' schemas for that:
it is made with the worker's tool specs. A parameter no schema names is kept as text.

The grammar writes the schema's parameters in its order (optional ones may be left out): typed values as compact
JSON of their schema, strings as an enum's choices, the schema's pattern, or raw text without ``</`` (so a
constrained value can never close its tag early).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .base import (
    ParsedTurn,
    ParseError,
    ToolCall,
    blocks_settled_content,
    check_offer,
    json_schema_rules,
    literal,
    prefixed_rules,
    tool_call_blocks,
)

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list, "null": type(None),
}
_NL = "\n"
# Raw text without "</" (a constrained value cannot close its tag early): each "<" run is followed by another char.
_TEXT_RULE = 'qc_text ::= ([^<] | "<"+ [^</])* "<"*'


class Qwen3CoderParser:
    """Calls end with ``</tool_call>`` in text; the turn ends at the template's end of turn (``<|im_end|>``)."""

    name = "qwen3_coder"
    stop_tokens: tuple[str, ...] = ()

    def __init__(self, tools: Sequence[dict[str, Any]] = ()) -> None:
        #: Parameter schemas by tool name, then parameter name (OpenAI specs).
        self.schemas: Mapping[str, Mapping[str, Any]] = {
            t["function"]["name"]: (t["function"].get("parameters") or {}).get("properties", {}) for t in tools
        }

    def parse(self, text: str) -> ParsedTurn:
        return tool_call_blocks(text, self._call)

    def settled_content(self, text: str) -> str:
        return blocks_settled_content(text)

    def _call(self, raw: str, body: str) -> ToolCall | ParseError:
        function = _FUNCTION.fullmatch(body)
        if function is None:
            return ParseError(raw, "a <tool_call> block must hold one <function=NAME>...</function>")
        name, inner = function.group(1).strip(), function.group(2)
        if _PARAMETER.sub("", inner).strip():
            return ParseError(raw, f"{name}: only <parameter=NAME>...</parameter> blocks may sit inside <function>")
        schemas = self.schemas.get(name, {})
        arguments: dict[str, Any] = {}
        for parameter in _PARAMETER.finditer(inner):
            key = parameter.group(1).strip()
            if key in arguments:
                return ParseError(raw, f"{name}: parameter {key!r} is given twice")
            value = parameter.group(2).removeprefix("\n").removesuffix("\n")
            arguments[key], wrong = _typed(value, schemas.get(key, {}))
            if wrong:
                return ParseError(raw, f"{name}: parameter {key!r} {wrong}")
        return ToolCall(name=name, arguments=arguments, raw=raw)

    def constraint(self, tools: Sequence[dict[str, Any]], max_calls: int) -> str:
        check_offer(tools, max_calls)
        rules = [
            f'root ::= qc_call ("\\n" qc_call){{0, {max_calls - 1}}}',
            'qc_call ::= "<tool_call>\\n" (' + " | ".join(f"qc_fn_{i}" for i in range(len(tools))) + ') "</tool_call>"',
            _TEXT_RULE,
        ]
        for i, tool in enumerate(tools):
            spec = tool["function"].get("parameters") or {}
            required = set(spec.get("required", ()))
            parts = []
            for j, (key, schema) in enumerate(spec.get("properties", {}).items()):
                value = f"qc_value_{i}_{j}"
                rules.append(_value_rules(schema, value))
                part = f"{literal(f'<parameter={key}>' + _NL)} {value} {literal(_NL + '</parameter>' + _NL)}"
                parts.append(part if key in required else f"({part})?")
            opening = literal(f"<function={tool['function']['name']}>\n")
            rules.append(f"qc_fn_{i} ::= " + " ".join([opening, *parts, literal("</function>\n")]))
        return "\n".join(rules) + "\n"


def _types(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type")
    return [kind] if isinstance(kind, str) else list(kind or [])


def _typed(value: str, schema: Mapping[str, Any]) -> tuple[Any, str]:
    """``value`` as the schema's type, and why it is not one ("" when it is)."""
    types = _types(schema)
    if not types or "string" in types:
        return value, ""
    try:
        decoded = json.loads(value)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return None, f"must be {' or '.join(types)} as JSON, not {value[:40]!r}"
    wanted = tuple(t for kind in types for t in _as_tuple(_JSON_TYPES.get(kind, object)))
    if isinstance(decoded, bool) and "boolean" not in types:  # JSON true is not a number here, as in the schema
        wanted = ()
    if not isinstance(decoded, wanted):
        return None, f"must be {' or '.join(types)}, not {value[:40]!r}"
    return decoded, ""


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _value_rules(schema: Mapping[str, Any], name: str) -> str:
    types = _types(schema)
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]) and (not types or types == ["string"]):
        return f"{name} ::= " + " | ".join(literal(v) for v in schema["enum"])
    if types == ["string"] and isinstance(schema.get("pattern"), str):  # the tool's own pattern, as JSON formats get
        import xgrammar

        return prefixed_rules(str(xgrammar.Grammar.from_regex(schema["pattern"])), name).strip()
    if not types or "string" in types:
        return f"{name} ::= qc_text"
    return json_schema_rules(dict(schema), name).strip()
