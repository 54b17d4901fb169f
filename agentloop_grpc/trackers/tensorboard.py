"""TensorBoard: scalars and the samples table as a text summary (a Markdown table), written with the tensorboard
package's own event-file writer, so the tensorboard extra alone is enough (no torch, no TensorFlow)."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from .base import SAMPLE_COLUMNS, SampleRow

#: The tag of the samples table in TensorBoard's Text tab.
SAMPLES_TAG = "samples"


class TensorBoardTracker:
    def __init__(self, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        self.logdir = logdir
        self._writer = EventFileWriter(str(logdir))
        self.where = f"tensorboard --logdir {logdir}"

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        values = [summary_pb2.Summary.Value(tag=key, simple_value=float(value)) for key, value in metrics.items()]
        self._write(summary_pb2.Summary(value=values), step)

    def log_samples(self, rows: Sequence[SampleRow], step: int) -> None:
        text = tensor_pb2.TensorProto(
            dtype="DT_STRING", string_val=[markdown_table(rows).encode()],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]),
        )
        # the text plugin shows a string tensor tagged with its plugin name
        metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        self._write(summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=SAMPLES_TAG, metadata=metadata,
                                                                         tensor=text)]), step)

    def close(self) -> None:
        self._writer.close()

    def _write(self, summary: summary_pb2.Summary, step: int) -> None:
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()


def markdown_table(rows: Sequence[SampleRow]) -> str:
    """The rows as a Markdown table (TensorBoard renders Markdown): pipes and newlines escaped to stay in a cell,
    and HTML escaped, so chat-template tokens such as <|im_start|> (tag-shaped) show as written."""
    def cell(value: object) -> str:
        text = html.escape(str(value), quote=False).replace("\\", "\\\\").replace("|", "\\|")
        return text.replace("\n", "<br>")

    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
    lines += ["| " + " | ".join(cell(v) for v in row.values()) + " |" for row in rows]
    return "\n".join(lines)
