"""A small generated set of coding tasks: little Python repositories, each with one seeded bug, an issue that
describes the symptom (not the fix), hidden tests and a known-good solution, in Harbor's layout (task.py).

Ten bugs, each in packages of several names, so ``count`` up to 40 tasks differ; the same ``seed`` gives the same
set. Each repository carries a visible test of the part that works, as real repositories do; the hidden tests check
the bug and the rest. ``solution/solve.sh`` rewrites the buggy module whole (what a scripted agent in the tests
does)."""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Bug:
    name: str
    function: str
    buggy: str
    fixed: str
    issue: str
    #: Hidden tests: assertions on ``{function}``, one test each.
    hidden: tuple[str, ...]
    #: A visible test of behaviour the bug leaves right.
    visible: str


BUGS: tuple[Bug, ...] = (
    Bug("clamp", "clamp",
        "def clamp(x, lo, hi):\n    return max(hi, min(lo, x))\n",
        "def clamp(x, lo, hi):\n    return max(lo, min(hi, x))\n",
        "`clamp(5, 0, 10)` returns 10 instead of 5: values inside the range should come back unchanged.",
        ("clamp(5, 0, 10) == 5", "clamp(-3, 0, 10) == 0", "clamp(42, 0, 10) == 10"),
        "clamp(0, 0, 0) == 0"),
    Bug("mean", "mean",
        "def mean(xs):\n    return sum(xs) / (len(xs) - 1)\n",
        "def mean(xs):\n    return sum(xs) / len(xs)\n",
        "`mean([2, 4, 6])` returns 6.0; the mean of those numbers is 4.0.",
        ("mean([2, 4, 6]) == 4.0", "mean([5]) == 5.0", "mean([1, 2]) == 1.5"),
        "mean([0, 0, 0]) == 0.0"),
    Bug("palindrome", "is_palindrome",
        "def is_palindrome(s):\n    return s == s[::-1]\n",
        "def is_palindrome(s):\n    t = ''.join(c.lower() for c in s if c.isalnum())\n    return t == t[::-1]\n",
        "`is_palindrome('Never odd or even')` is False: case, spaces and punctuation should not count.",
        ("is_palindrome('Never odd or even')", "is_palindrome('A man, a plan, a canal: Panama')",
         "not is_palindrome('abc')"),
        "is_palindrome('abba')"),
    Bug("fizzbuzz", "fizzbuzz",
        "def fizzbuzz(n):\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n"
        "    if n % 15 == 0:\n        return 'FizzBuzz'\n    return str(n)\n",
        "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return 'Fizz'\n"
        "    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)\n",
        "`fizzbuzz(15)` returns 'Fizz'; multiples of both 3 and 5 should give 'FizzBuzz'.",
        ("fizzbuzz(15) == 'FizzBuzz'", "fizzbuzz(30) == 'FizzBuzz'", "fizzbuzz(9) == 'Fizz'"),
        "fizzbuzz(7) == '7'"),
    Bug("wordcount", "word_count",
        "def word_count(text):\n    return len(text.split(' '))\n",
        "def word_count(text):\n    return len(text.split())\n",
        "`word_count('a  b')` (two spaces) returns 3; it should count the words, 2.",
        ("word_count('a  b') == 2", "word_count('  hello world  ') == 2", "word_count('') == 0"),
        "word_count('one two') == 2"),
    Bug("factorial", "factorial",
        "def factorial(n):\n    out = 1\n    for i in range(1, n):\n        out *= i\n    return out\n",
        "def factorial(n):\n    out = 1\n    for i in range(1, n + 1):\n        out *= i\n    return out\n",
        "`factorial(5)` returns 24 instead of 120.",
        ("factorial(5) == 120", "factorial(1) == 1", "factorial(3) == 6"),
        "factorial(0) == 1"),
    Bug("reverse", "reverse_words",
        "def reverse_words(s):\n    return s[::-1]\n",
        "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
        "`reverse_words('hello world')` returns 'dlrow olleh'; it should reverse the order of the words: "
        "'world hello'.",
        ("reverse_words('hello world') == 'world hello'", "reverse_words('a b c') == 'c b a'",
         "reverse_words('one') == 'one'"),
        "reverse_words('') == ''"),
    Bug("temperature", "celsius_to_fahrenheit",
        "def celsius_to_fahrenheit(c):\n    return c * 5 / 9 + 32\n",
        "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32\n",
        "`celsius_to_fahrenheit(100)` returns 87.55...; water boils at 212 F.",
        ("celsius_to_fahrenheit(100) == 212", "celsius_to_fahrenheit(-40) == -40", "celsius_to_fahrenheit(10) == 50"),
        "celsius_to_fahrenheit(0) == 32"),
    Bug("chunks", "chunks",
        "def chunks(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs) - n + 1, n)]\n",
        "def chunks(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs), n)]\n",
        "`chunks([1, 2, 3, 4, 5], 2)` drops the 5: the last, shorter chunk should be kept.",
        ("chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]", "chunks([1], 3) == [[1]]", "chunks([], 2) == []"),
        "chunks([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]"),
    Bug("median", "median",
        "def median(xs):\n    mid = len(xs) // 2\n    if len(xs) % 2:\n        return xs[mid]\n"
        "    return (xs[mid - 1] + xs[mid]) / 2\n",
        "def median(xs):\n    xs = sorted(xs)\n    mid = len(xs) // 2\n    if len(xs) % 2:\n        return xs[mid]\n"
        "    return (xs[mid - 1] + xs[mid]) / 2\n",
        "`median([3, 1, 2])` returns 1; the median of 1, 2 and 3 is 2.",
        ("median([3, 1, 2]) == 2", "median([4, 1, 3, 2]) == 2.5", "median([9, 7, 8]) == 8"),
        "median([1, 2, 3]) == 2"),
)
PACKAGES = ("toolbox", "utilkit", "helpers", "corelib")

_TEST_SH = """#!/usr/bin/env bash
# The hidden tests, run in /app after the agent is done; the JUnit report is the verdict (pass rate).
cd /app
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
python -m pytest -q -p no:cacheprovider --junitxml=/logs/verifier/junit.xml /tests/test_hidden.py
"""


def generate_tasks(folder: str | Path, count: int = 20, seed: int = 0) -> list[Path]:
    """``count`` tasks (at most len(BUGS) * len(PACKAGES)) written under ``folder``; their folders."""
    limit = len(BUGS) * len(PACKAGES)
    if not 1 <= count <= limit:
        raise ValueError(f"count must be in [1, {limit}]")
    pairs = [(bug, package) for package in PACKAGES for bug in BUGS][:count]
    random.Random(seed).shuffle(pairs)
    return [_write(Path(folder), i, bug, package) for i, (bug, package) in enumerate(pairs)]


def _write(root: Path, index: int, bug: Bug, package: str) -> Path:
    task = root / f"{index:03d}-{package}-{bug.name}"
    module = f"{package}/{bug.name}.py"
    files = {
        "instruction.md": f"# Bug: {bug.function} is wrong\n\n{bug.issue}\n\nThe code is in `{module}`. Fix the bug "
                          "in the repository (in place); do not change the tests.\n",
        "task.toml": 'version = "1.0"\n\n[metadata]\ndifficulty = "easy"\ncategory = "debugging"\n\n'
                     "[agent]\ntimeout_sec = 300.0\n\n[verifier]\ntimeout_sec = 60.0\n",
        "environment/Dockerfile": "FROM python:3.11-slim\nRUN pip install pytest\nWORKDIR /app\nCOPY . /app\n",
        f"environment/{package}/__init__.py": f"from .{bug.name} import {bug.function}\n",
        f"environment/{module}": bug.buggy,
        "environment/README.md": f"# {package}\n\nSmall helpers. Run the tests with `python -m pytest`.\n",
        f"environment/tests/test_{bug.name}.py": f"from {package} import {bug.function}\n\n\n"
                                                  f"def test_{bug.name}_basic():\n    assert {bug.visible}\n",
        "tests/test.sh": _TEST_SH,
        "tests/test_hidden.py": f"from {package} import {bug.function}\n" + "".join(
            f"\n\ndef test_{bug.name}_{j}():\n    assert {check}\n" for j, check in enumerate(bug.hidden)),
        "solution/solve.sh": f"#!/usr/bin/env bash\ncat > /app/{module} <<'EOF'\n{bug.fixed}EOF\n",
    }
    for name, text in files.items():
        path = task / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text) if name.endswith(".toml") else text)
    return task


def fixed_source(task: Path) -> tuple[str, str]:
    """(module path in the repository, its fixed source) of a generated task: what a known-good agent writes."""
    for bug in BUGS:
        for package in PACKAGES:
            if task.name.endswith(f"-{package}-{bug.name}"):
                return f"{package}/{bug.name}.py", bug.fixed
    raise ValueError(f"{task} is not a generated task")
