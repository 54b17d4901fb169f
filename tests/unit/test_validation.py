"""The validation catalogue's bounds on constraints: what counts as nesting, and what they cost to check."""

from __future__ import annotations

import pytest

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.types import StructuredOutput
from agentloop_grpc.engine_adapters.validation import MAX_NESTING, check_structured_output

pytestmark = pytest.mark.fault


@pytest.mark.parametrize(
    "pattern",
    [
        r"\(" * (MAX_NESTING + 1) + "a",  # escaped parentheses open no group
        "[(]" * (MAX_NESTING + 1),  # nor do parentheses in a character class
        "[](]" * (MAX_NESTING + 1),  # a class whose first character is ]
        r"[\](]" * (MAX_NESTING + 1),  # a class holding an escaped ]
        "(a)" * 10_000,  # many groups side by side, each one level deep
    ],
)
def test_parentheses_that_open_no_group_do_not_count_as_nesting(pattern: str) -> None:
    check_structured_output(StructuredOutput("regex", pattern))


def test_groups_after_escapes_and_classes_count() -> None:
    pattern = r"\\[(]" + "(" * (MAX_NESTING + 1) + "a" + ")" * (MAX_NESTING + 1)
    with pytest.raises(InvalidRequestError, match="nested more than"):
        check_structured_output(StructuredOutput("regex", pattern))


def test_schema_numbers_are_checked_as_text() -> None:
    check_structured_output(StructuredOutput("json_schema", '{"maximum": ' + "9" * 100 + ', "minimum": -1.5e300}'))
    with pytest.raises(InvalidRequestError, match="a number of 101 characters"):
        check_structured_output(StructuredOutput("json_schema", '{"maximum": ' + "9" * 101 + "}"))


def test_wide_schemas_are_not_deep() -> None:
    wide = "{" + ", ".join(f'"p{i}": {{"type": "integer"}}' for i in range(2000)) + "}"
    check_structured_output(StructuredOutput("json_schema", '{"type": "object", "properties": ' + wide + "}"))
