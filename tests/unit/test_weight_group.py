"""Weight-transfer groups on their own: the layout both ends compute, and a leader broadcasting to two members
over a real gloo group (threads of this process)."""

from __future__ import annotations

import itertools
import threading

import torch

from agentloop_grpc.common.weight_group import WeightGroupLeader, WeightGroupMember
from agentloop_grpc.common.weight_layout import ALIGN, BucketLayout, TensorSpec, WeightGroupError, WeightGroupSpec

SPECS = [TensorSpec("a", "float32", (3, 5)), TensorSpec("b", "bfloat16", (7,)), TensorSpec("c", "int64", ()),
         TensorSpec("empty", "float32", (0, 4)), TensorSpec("d", "float32", (600, 700))]


def test_the_layout_aligns_every_tensor_and_cuts_the_bytes_into_bounded_pieces() -> None:
    layout = BucketLayout.of(SPECS, 1 << 20)
    assert all(offset % ALIGN == 0 for offset in layout.offsets)
    ends = [o + s.nbytes for o, s in zip(layout.offsets, SPECS)]
    assert all(end <= nxt for end, nxt in zip(ends, layout.offsets[1:]))  # no overlap
    pieces = list(layout.pieces())
    assert pieces[0][0] == 0 and pieces[-1][1] == layout.total_bytes == ends[-1]
    assert all(end - start <= 1 << 20 for start, end in pieces) and len(pieces) == 2  # d is 1.68 MB
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))


def test_a_leader_broadcasts_to_every_member_and_a_refusal_moves_nothing() -> None:
    store, port = WeightGroupLeader.host("127.0.0.1", 3, 30)
    generator = torch.Generator().manual_seed(0)
    values = [torch.randn(3, 5, generator=generator), torch.randn(7, generator=generator).to(torch.bfloat16),
              torch.tensor(42), torch.empty(0, 4), torch.randn(600, 700, generator=generator)]
    sources = [values[0].numpy().tobytes(), *values[1:]]  # bytes or tensors
    layout = BucketLayout.of(SPECS, 1 << 20)
    received: dict[int, list] = {}
    refused: dict[int, object] = {}

    def member(rank: int) -> None:
        joined = WeightGroupMember.join(WeightGroupSpec("g", "127.0.0.1", port, 3, rank, "gloo", 30), rank)
        received[rank] = layout.views(joined.vote_and_receive(layout, True))
        refused[rank] = joined.vote_and_receive(layout, rank != 2)  # rank 2 refuses the second update
        joined.close()

    threads = [threading.Thread(target=member, args=(rank,)) for rank in (1, 2)]
    for thread in threads:
        thread.start()
    leader = WeightGroupLeader.form(store, WeightGroupSpec("g", "127.0.0.1", port, 3, 0, "gloo", 30))
    assert leader.vote(True)
    leader.send(layout, sources)
    assert not leader.vote(True)  # the second update: refused by rank 2, so nothing is sent
    for thread in threads:
        thread.join(timeout=60)
    leader.close()
    for rank in (1, 2):
        assert [spec for spec, _ in received[rank]] == SPECS
        for (_, got), value in zip(received[rank], values):
            assert got.dtype == value.dtype and torch.equal(got, value)
        assert refused[rank] is None


def test_a_spec_names_what_keeps_it_from_forming() -> None:
    spec = WeightGroupSpec("g", "127.0.0.1", 1234, 3, 1, "gloo")
    assert spec.problem(2) is None
    assert "ranks 1..3" in spec.problem(3)
    assert "backend" in WeightGroupSpec("g", "h", 1, 3, 1, "mpi").problem(1)
    assert "group_name" in WeightGroupSpec("", "h", 1, 3, 1).problem(1)


def test_bytes_are_handed_on_only_once_every_rank_has_them_all() -> None:
    """The leader sends every piece, then goes (as a partitioned or crashed rank would) before the commit: no member
    hands the bytes on to be applied, each fails instead, although each received them all."""
    store, port = WeightGroupLeader.host("127.0.0.1", 3, 10)
    layout = BucketLayout.of(SPECS, 1 << 20)
    outcomes: dict[int, object] = {}

    def member(rank: int) -> None:
        joined = WeightGroupMember.join(WeightGroupSpec("g", "127.0.0.1", port, 3, rank, "gloo", 10), rank)
        try:
            outcomes[rank] = joined.vote_and_receive(layout, True)
        except WeightGroupError as error:
            outcomes[rank] = error
        joined.close()

    threads = [threading.Thread(target=member, args=(rank,)) for rank in (1, 2)]
    for thread in threads:
        thread.start()
    leader = WeightGroupLeader.form(store, WeightGroupSpec("g", "127.0.0.1", port, 3, 0, "gloo", 10))
    assert leader.vote(True)
    piece = torch.zeros(layout.bucket_bytes, dtype=torch.uint8)
    for start, end in layout.pieces():  # every byte, but no commit
        leader._broadcast(piece[: end - start])
    leader.close()
    for thread in threads:
        thread.join(timeout=60)
    assert all(isinstance(outcomes[rank], WeightGroupError) for rank in (1, 2)), outcomes
