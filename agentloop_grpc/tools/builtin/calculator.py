"""calculator: exact arithmetic through a parser of Python's expression syntax, never ``eval``.

Only numbers, + - * / // % ** and parentheses (and unary signs) are accepted; anything else (names, calls,
attributes) is rejected with a message the model can act on. Results are exact for integers. Every integer
product and power is bounded *before* it is computed (at least MAX_RESULT_BITS bits is refused): a bound on the
exponent alone let ``((9**999)**999)**999`` build a multi-gigabit integer while holding the GIL, and the whole
tool server stopped answering.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Annotated

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 1000
MAX_RESULT_BITS = 4096
MAX_LENGTH = 500
#: What an expression may contain (also the schema's pattern, so a constrained call can only write these; at most
#: 60 characters: xgrammar 0.2 fails to compile a serialised grammar with a {1,200} repetition).
EXPRESSION_PATTERN = r"^[0-9+\-*/%(). ]{1,60}$"


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and (type(node.value) is int or type(node.value) is float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        _check_size(node.op, left, right)
        try:
            return _BINARY[type(node.op)](left, right)
        except OverflowError:
            raise ValueError(f"{ast.unparse(node)!r} overflows a float") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported element {ast.unparse(node)!r}: use numbers, + - * / // % ** and parentheses")


def _check_size(op: ast.operator, left: int | float, right: int | float) -> None:
    """Refuse an integer product or power whose result would have more than MAX_RESULT_BITS bits (a lower bound
    of its size, computed from the operands' sizes without computing it)."""
    if type(left) is not int or type(right) is not int:
        return
    if isinstance(op, ast.Mult):
        bits = abs(left).bit_length() + abs(right).bit_length() - 1 if left and right else 0
    elif isinstance(op, ast.Pow) and right > 0:
        bits = (abs(left).bit_length() - 1) * right
    else:
        return
    if bits > MAX_RESULT_BITS:
        raise ValueError(f"the result would have more than {MAX_RESULT_BITS} bits (about {bits} bits)")


def _format(value: int | float) -> str:
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return str(int(value))
        return repr(value)
    return str(value)


def calculator(expression: Annotated[str, {"pattern": EXPRESSION_PATTERN}]) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Args:
        expression: Arithmetic with numbers, + - * / // % ** and parentheses, e.g. "(17 + 23) * 3".
    """
    if len(expression) > MAX_LENGTH:
        raise ValueError(f"expression is longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {error.msg}") from None
    return _format(_evaluate(tree.body))
