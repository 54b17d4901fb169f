"""The samples table as TensorBoard's text tab shows it: one Markdown row per trajectory, whatever the text holds."""

from __future__ import annotations

from agentloop_grpc.trackers import SampleRow
from agentloop_grpc.trackers.tensorboard import markdown_table


def test_cells_keep_pipes_newlines_and_tags_inside():
    row = SampleRow("g/0", "<|im_start|>user\nWhat is 2 | 3?", "a\\b", 0.5, "stop", "")
    header, rule, line = markdown_table([row]).splitlines()
    assert header == "| sample_id | prompt | response | reward | termination | error |"
    assert rule == "|" + "---|" * 6
    assert line == "| g/0 | &lt;\\|im_start\\|&gt;user<br>What is 2 \\| 3? | a\\\\b | 0.5 | stop |  |"
