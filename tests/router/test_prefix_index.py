"""The Router's record of which prompt prefixes went to which server: chained block keys, bounded LRU."""

from __future__ import annotations

from array import array

from agentloop_grpc.router.prefix_index import MAX_BLOCKS, PrefixIndex


def _raw(ids) -> bytes:
    return array("i", ids).tobytes()


def test_keys_name_whole_prefixes():
    index = PrefixIndex(max_blocks=1000, block_tokens=4)
    shared = list(range(8))
    a, b = index.keys(_raw(shared + [100, 101, 102, 103, 9])), index.keys(_raw(shared + [200, 201, 202, 203]))
    assert len(a) == len(b) == 3  # whole blocks only
    assert a[:2] == b[:2] and a[2] != b[2]
    # the same block after a different prefix is another key
    assert index.keys(_raw([7, 7, 7, 7] + shared[4:]))[1] != a[1]
    assert len(index.keys(_raw(list(range(4 * (MAX_BLOCKS + 5)))))) == MAX_BLOCKS


def test_matched_counts_leading_blocks_per_server():
    index = PrefixIndex(max_blocks=1000, block_tokens=4)
    system = list(range(8))
    index.record(index.keys(_raw(system + [1, 1, 1, 1])), "s1")
    index.record(index.keys(_raw(system)), "s2")
    assert index.matched(index.keys(_raw(system + [1, 1, 1, 1, 5, 5, 5, 5]))) == {"s1": 3, "s2": 2}
    assert index.matched(index.keys(_raw(system + [2, 2, 2, 2]))) == {"s1": 2, "s2": 2}
    assert index.matched(index.keys(_raw([9] * 8))) == {}


def test_memory_is_bounded_and_prefixes_keep_their_start():
    index = PrefixIndex(max_blocks=50, block_tokens=4)
    for prompt in range(100):
        index.record(index.keys(_raw([1, 2, 3, 4] + [prompt] * 16)), f"s{prompt % 3}")
    assert len(index) == 50
    # the shared first block was recorded last each time: it is the one kept longest
    assert index.matched(index.keys(_raw([1, 2, 3, 4]))) == {"s0": 1, "s1": 1, "s2": 1}
    index.clear()
    assert len(index) == 0 and index.matched(index.keys(_raw([1, 2, 3, 4]))) == {}


def test_off_hashes_nothing():
    assert PrefixIndex(max_blocks=0, block_tokens=4).keys(_raw(range(64))) == []
