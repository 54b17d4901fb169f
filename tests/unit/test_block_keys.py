"""BlockKeys: the fake engine's prefix-cache keys, a polynomial hash of each full block's whole prefix."""

from __future__ import annotations

import numpy as np

from agentloop_grpc.engine_adapters.block_keys import BlockKeys

from .hash_seeds import outputs_under_hash_seeds

TOKENS = np.arange(1000, 1100)  # 100 tokens: 6 full blocks of 16


def _keys(tokens: np.ndarray, limit: int | None = None) -> list[int]:
    hasher = BlockKeys(16, expected_len=8)  # smaller than the input: the power table grows
    return hasher.keys(hasher.prefix_sums(tokens), 0, tokens.size if limit is None else limit).tolist()


def test_a_block_key_depends_on_every_token_before_the_block_end_and_none_after() -> None:
    keys = _keys(TOKENS)
    assert len(keys) == 6 and len(set(keys)) == 6
    changed = TOKENS.copy()
    changed[50] += 1  # inside block 3 (tokens 48-63)
    assert _keys(changed)[:3] == keys[:3]
    assert all(a != b for a, b in zip(_keys(changed)[3:], keys[3:], strict=True))
    swapped = TOKENS.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # same tokens, another order
    assert all(a != b for a, b in zip(_keys(swapped), keys, strict=True))
    assert _keys(TOKENS, limit=63) == keys[:3]  # only blocks that end within the limit


def test_extending_the_sums_equals_hashing_the_whole_sequence() -> None:
    hasher = BlockKeys(16)
    prompt, output = TOKENS[:70], TOKENS[70:]
    sums = hasher.prefix_sums(prompt)
    extended = np.concatenate((sums, hasher.prefix_sums(output, offset=prompt.size, start=int(sums[-1]))))
    assert extended.tolist() == hasher.prefix_sums(TOKENS).tolist()
    assert hasher.keys(extended, 64, extended.size).tolist() == _keys(TOKENS)[4:]


def test_zero_tokens_and_lengths_are_told_apart() -> None:
    zeros = np.zeros(64, dtype=np.int64)
    keys = _keys(zeros)
    assert len(set(keys)) == 4  # a prefix of zeros has a different key at every length


def test_keys_are_the_same_in_every_process() -> None:
    script = (
        "import numpy as np; from agentloop_grpc.engine_adapters.block_keys import BlockKeys; "
        "h = BlockKeys(16); print(h.keys(h.prefix_sums(np.arange(1000, 1100)), 0, 100).tolist())"
    )
    runs = outputs_under_hash_seeds(script)
    assert runs == {str(_keys(TOKENS))}
