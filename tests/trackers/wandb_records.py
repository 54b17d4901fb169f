"""Read back a W&B offline run: its .wandb file is a LevelDB-style log of protobuf records (wandb 0.31 ships no
reader of its own), so this reads the log's blocks and parses the records with wandb's own protobuf classes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

_FILE_HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version
_RECORD_HEADER = struct.Struct("<IHB")  # checksum, length, type (1 full, 2 first, 3 middle, 4 last)
_BLOCK = 32768


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    ident, magic, _ = _FILE_HEADER.unpack_from(data)
    assert ident == b":W&B" and magic == 0xBEE1, f"{path} is not a W&B run file"
    found, pending, offset = [], b"", _FILE_HEADER.size
    while offset + _RECORD_HEADER.size <= len(data):
        room = _BLOCK - offset % _BLOCK
        if room < _RECORD_HEADER.size:  # a block's tail too short for a header is padding
            offset += room
            continue
        _, length, kind = _RECORD_HEADER.unpack_from(data, offset)
        if kind == 0:  # zero fill: the next block
            offset += room
            continue
        start = offset + _RECORD_HEADER.size
        pending += data[start:start + length]
        offset = start + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            found.append(record)
            pending = b""
    return found


def history(run_dir: Path) -> list[dict]:
    """Every history row (``run.log`` call) of the offline run in ``run_dir``, values decoded from JSON. The run's
    service writes its file on its own schedule: a file read before the service closed it lacks the exit record."""
    (path,) = run_dir.glob("run-*.wandb")
    found = records(path)
    kinds = [record.WhichOneof("record_type") for record in found]
    assert kinds and kinds[-1] == "exit", f"{path} is not complete (no exit record yet): {kinds[-5:]}"
    rows = []
    for record in found:
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows
