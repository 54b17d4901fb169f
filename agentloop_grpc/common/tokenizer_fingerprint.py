"""The tokenizer fingerprint: one digest that every engine reports in GetServerInfo and every client recomputes.

It lives at the package's top so engine adapters and client code share it without importing each other: equal
fingerprints mean equal vocabularies and special tokens, so ids mean the same thing on both sides.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

PREFIX = "sha256:"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A digest of the vocabulary and special tokens: equal fingerprints tokenize alike."""
    digest = hashlib.sha256()
    digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    digest.update(json.dumps(sorted(map(str, tokenizer.all_special_tokens))).encode())
    return PREFIX + digest.hexdigest()[:16]
