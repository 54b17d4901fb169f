"""Error causes: errors that differ only in numbers or ids count as one cause, shown by its first error."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from agentloop_grpc.rollout.command import report_failures
from agentloop_grpc.rollout.error_causes import shape, top_causes
from agentloop_grpc.rollout.run import RunRecord


def test_errors_differing_in_numbers_are_one_cause():
    errors = [f"prompt_ids[3] = {50000 + i} is outside the vocabulary [0, 49152)" for i in range(3)]
    assert top_causes([*errors, "tool 'calc' timed out", None]) == [
        ("prompt_ids[3] = 50000 is outside the vocabulary [0, 49152) (one example; the others differ only in "
         "numbers or ids)", 3),
        ("tool 'calc' timed out", 1),
        ("no error recorded", 1),
    ]


def test_identical_errors_need_no_note_and_only_the_first_line_counts():
    assert top_causes(["B: y\ntraceback line 1", "B: y\nother", "A: x"]) == [("B: y", 2), ("A: x", 1)]


def test_ids_are_masked_whole():
    assert shape("request 3f2b9c1e-0a4d-4c2e-9b1f-2d3c4b5a6e7f of sample 5b8d0e2a91 failed after 1.5e3 s") == (
        "request <id> of sample <id> failed after # s")
    assert top_causes(["x"] * 2 + ["y"] * 3 + ["z"], top=2) == [("y", 3), ("x", 2)]


def test_the_rollout_prints_them_grouped(capsys):
    errors = ["prompt id 50001 is outside the vocabulary", "prompt id 50002 is outside the vocabulary", None]
    trajectories = [SimpleNamespace(failed=e is not None, error=e) for e in errors]
    report_failures(RunRecord(output_dir=Path("out"), trajectories=trajectories), max_failed_share=1.0)
    assert capsys.readouterr().err.splitlines()[1:] == [
        "  2 x prompt id 50001 is outside the vocabulary (one example; the others differ only in numbers or ids)"]
