"""Arithmetic tasks, generated from a seed (nothing is downloaded); the ground truth is computed here, exactly.

- ``word_problems`` (``examples/demo-word-problems.yaml``): each problem chains two or three integer steps through
  a small story ("Ana has 12 apples. She buys 3 bags of 7 apples each. ..."); the untrained 135M model solves none
  of them.
- ``one_step`` (``make demo`` and ``make train``): "What is 14 + 9?" with operands and operations chosen by the
  config; the untrained model solves some of them (``agentloop_grpc/train/NOTES.md``), so GRPO groups differ.

A model that calls the calculator with the right expression and submits the result with ``check_answer`` is
rewarded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jia", "Kofi", "Lena")
_ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells")

SYSTEM_PROMPT = (
    "You solve arithmetic word problems with tools. First call the calculator with one expression that "
    "computes the answer from the numbers in the problem. Then call check_answer with the number the calculator "
    "returned.\n\nExample. Problem: Sam has 4 bags of 6 apples and 5 more apples. How many apples does Sam have?\n"
    'First call: calculator {"expression": "4 * 6 + 5"}. The calculator returns 29.\n'
    'Second call: check_answer {"answer": "29"}.'
)


@dataclass(frozen=True, slots=True)
class Problem:
    question: str
    expression: str
    answer: int


def problem(rng: random.Random) -> Problem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    start = rng.randint(5, 60)
    bags, per_bag = rng.randint(2, 9), rng.randint(3, 12)
    kind = rng.randrange(3)
    if kind == 0:
        lost = rng.randint(1, start)
        text = (f"{name} has {start} {item}. {name} buys {bags} bags with {per_bag} {item} in each bag, then gives "
                f"away {lost} {item}. How many {item} does {name} have now?")
        expression = f"{start} + {bags} * {per_bag} - {lost}"
    elif kind == 1:
        friends = rng.randint(2, 6)
        total = friends * rng.randint(2, 15)
        text = (f"{name} has {bags} boxes of {per_bag} {item} and {total} loose {item}. The loose {item} are shared "
                f"equally among {friends} friends, and {name} keeps one share and all the boxes. How many {item} "
                f"does {name} keep?")
        expression = f"{bags} * {per_bag} + {total} / {friends}"
    else:
        days = rng.randint(2, 7)
        text = (f"{name} collects {per_bag} {item} every day for {days} days and already had {start}. "
                f"How many {item} does {name} have in total?")
        expression = f"{per_bag} * {days} + {start}"
    answer = eval(expression, {"__builtins__": {}})  # noqa: S307 - our own literal arithmetic
    return Problem(text, expression, int(answer))


ONE_STEP_SYSTEM_PROMPT = (
    "You solve arithmetic problems with tools. First call the calculator with the expression. Then call "
    "check_answer with the number the calculator returned.\n\nExample. Problem: What is 4 + 6?\n"
    'First call: calculator {"expression": "4 + 6"}. The calculator returns 10.\n'
    'Second call: check_answer {"answer": "10"}.'
)


def one_step_problem(rng: random.Random, operations: str, max_operand: int) -> Problem:
    a, b, op = rng.randint(1, max_operand), rng.randint(1, max_operand), rng.choice(operations)
    expression = f"{a} {op} {b}"
    return Problem(f"What is {expression}?", expression, int(eval(expression, {"__builtins__": {}})))  # noqa: S307


def problems(count: int, seed: int, kind: str = "word_problems", operations: str = "+",
             max_operand: int = 20) -> list[Problem]:
    rng = random.Random(seed)
    if kind == "one_step":
        return [one_step_problem(rng, operations, max_operand) for _ in range(count)]
    return [problem(rng) for _ in range(count)]


def dataset_rows(count: int, seed: int, kind: str = "word_problems", operations: str = "+",
                 max_operand: int = 20) -> list[dict]:
    """Rows in the rollout dataset format (see rollout/dataset.py)."""
    system = ONE_STEP_SYSTEM_PROMPT if kind == "one_step" else SYSTEM_PROMPT
    return [
        {
            "id": f"arith-{seed}-{i}",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": p.question}],
            "ground_truth": str(p.answer),
            "tools": ["calculator", "check_answer"],
            "loop": "tool",
        }
        for i, p in enumerate(problems(count, seed, kind, operations, max_operand))
    ]
