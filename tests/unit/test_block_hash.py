"""BlockChain: chained keys of a sequence's full blocks, extended as the sequence grows."""

from __future__ import annotations

import numpy as np

from agentloop_grpc.common.prompt import PromptIds
from agentloop_grpc.engine_adapters.block_hash import BlockChain

TOKENS = list(range(1000, 1100))  # 100 tokens: 6 full blocks of 16


def _keys(tokens: list[int]) -> list[int]:
    return BlockChain(16, tokens).keys


def test_a_block_key_depends_on_every_token_before_the_block_end_and_none_after() -> None:
    keys = _keys(TOKENS)
    assert len(keys) == 6 and len(set(keys)) == 6
    changed = TOKENS.copy()
    changed[50] += 1  # inside block 3 (tokens 48-63)
    assert _keys(changed)[:3] == keys[:3]
    assert all(a != b for a, b in zip(_keys(changed)[3:], keys[3:], strict=True))
    swapped = TOKENS.copy()
    swapped[0], swapped[1] = swapped[1], swapped[0]  # same tokens, another order
    assert all(a != b for a, b in zip(_keys(swapped), keys, strict=True))
    assert _keys(TOKENS[:63]) == keys[:3]  # only full blocks have keys


def test_extending_equals_hashing_the_whole_sequence_at_once() -> None:
    chain = BlockChain(16, PromptIds(TOKENS[:70]))  # the prompt as it arrives: int32 bytes
    assert len(chain.keys) == 4 and len(chain) == 70
    chain.extend(TOKENS[70:75])  # no block completed
    assert len(chain.keys) == 4
    chain.extend(np.array(TOKENS[75:]))  # the output, in pieces that straddle block ends
    assert chain.keys == _keys(TOKENS) and len(chain) == 100
    assert chain.block(2) == PromptIds(TOKENS[32:48]).raw


def test_zero_tokens_and_lengths_are_told_apart() -> None:
    assert len(set(_keys([0] * 64))) == 4  # a prefix of zeros has another key at every length
    assert BlockChain(16).keys == [] and len(BlockChain(16)) == 0


def test_a_block_overlapping_an_image_is_keyed_by_the_picture_too():
    from agentloop_grpc.common.media import MediaInput

    def chain(picture: bytes) -> BlockChain:
        return BlockChain(16, TOKENS[:70], [MediaInput("image/png", picture, offset=20, length=19)])

    red, blue, plain = chain(b"red"), chain(b"red"), BlockChain(16, TOKENS[:70])
    other = chain(b"blue")
    assert red.keys == blue.keys  # the same picture: the same keys
    assert other.keys[0] == red.keys[0] == plain.keys[0]  # the block before the image is shared
    assert all(a != b for a, b in zip(other.keys[1:], red.keys[1:], strict=True))  # blocks 1-2 overlap it, 3 follows
    assert plain.keys[1] != red.keys[1] and other.block(1) != red.block(1)
    assert red.block(0) == plain.block(0)
