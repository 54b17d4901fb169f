"""The top error causes of a run's failed trajectories: errors that differ only in numbers or ids are one cause.

A rollout whose trajectories fail prints its most common errors with counts. Errors of one cause often differ in
a token id, a length or a request id ("prompt id 50001 is outside the vocabulary", "prompt id 50002 ..."), so each
error's first line is reduced to a shape (numbers and ids masked) and errors are counted by shape; the cause shown
is the first error of its shape, verbatim, so the user sees a real message.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

NO_ERROR = "no error recorded"

# ids first (a uuid or a long hex string holds digits the number pattern would cut into pieces), then numbers
_ID = re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b|\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def shape(error: str) -> str:
    """``error``'s first line with every id and number masked: what errors of one cause share."""
    return _NUMBER.sub("#", _ID.sub("<id>", error))


def top_causes(errors: Iterable[str | None], top: int = 5) -> list[tuple[str, int]]:
    """The ``top`` most common causes of ``errors`` (one per failed trajectory; None: nothing recorded), each as
    its first error's first line and the number of errors of its shape, most common first (ties: first seen)."""
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    variants: dict[str, set[str]] = {}
    for error in errors:
        lines = (error or "").strip().splitlines()
        line = lines[0] if lines else NO_ERROR
        key = shape(line)
        counts[key] += 1
        first.setdefault(key, line)
        variants.setdefault(key, set()).add(line)
    return [(first[key] + (" (one example; the others differ only in numbers or ids)"
                           if len(variants[key]) > 1 else ""), count)
            for key, count in counts.most_common(top)]
