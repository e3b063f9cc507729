"""W&B's offline transaction logs (``run-<id>.wandb``) read back without lightning_ext and without wandb's reader.

wandb 0.31 ships no Python reader for them. The format: a 7-byte header (``:W&B``, magic ``0xBEE1``, version 0), then
LevelDB's log format in 32 KiB blocks (each record: CRC-32 of its type byte and data, length, type; a record split
across blocks as FIRST, MIDDLE..., LAST), each record's data one protobuf ``Record`` of ``wandb_internal_pb2``.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024
_RECORD = struct.Struct("<IHB")  # CRC-32 (zlib's, of the type byte then the data), data length, type
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str | Path) -> Iterator[wandb_internal_pb2.Record]:
    """Every ``Record`` in the file, in order; a record cut short at the end (a run still writing) is left out."""
    data = Path(path).read_bytes()
    assert data[: len(HEADER)] == HEADER, f"{path}: not a W&B transaction log (header {data[:7]!r})"
    position, pieces = len(HEADER), b""
    while position + _RECORD.size <= len(data):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < _RECORD.size:  # too little room for a header: the block's tail is padding
            position += left_in_block
            continue
        checksum, length, kind = _RECORD.unpack_from(data, position)
        start = position + _RECORD.size
        if kind == 0 and length == 0:  # zero padding to the block's end
            position += left_in_block
            continue
        if start + length > len(data):
            return
        chunk = data[start : start + length]
        assert zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF == checksum, f"{path}: bad checksum at {position}"
        position = start + length
        if kind == _FULL:
            yield wandb_internal_pb2.Record.FromString(chunk)
        elif kind == _FIRST:
            pieces = chunk
        elif kind == _MIDDLE:
            pieces += chunk
        elif kind == _LAST:
            yield wandb_internal_pb2.Record.FromString(pieces + chunk)
        else:
            raise AssertionError(f"{path}: unknown record type {kind} at {position}")


@dataclass
class OfflineRun:
    """What one transaction log says about its run: as W&B would show it once synced."""

    path: Path
    id: str = ""
    name: str = ""
    group: str = ""
    project: str = ""
    job_type: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # one dict per logged step, its values by key
    exit_code: int | None = None

    def curve(self, key: str, step_key: str = "trainer/global_step") -> list[tuple[int, float]]:
        """``(step, value)`` of ``key`` in the order logged, the step read from ``step_key``."""
        return [(int(row[step_key]), float(row[key])) for row in self.history if key in row]


def read_run(path: str | Path) -> OfflineRun:
    """The run of one ``run-<id>.wandb`` file."""
    run = OfflineRun(Path(path))
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            info = record.run
            run.id, run.name, run.group = info.run_id, info.display_name, info.run_group
            run.project, run.job_type = info.project, info.job_type
            run.config.update(_items(info.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def _items(items: Any) -> dict[str, Any]:
    """Items by key (wandb 0.31 writes a key as ``nested_key``, its value as JSON; a typed value is read too)."""
    found = {}
    for item in items:
        kind = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None
        value = json.loads(item.value_json) if item.value_json else getattr(item, kind) if kind else None
        found[item.key or "/".join(item.nested_key)] = value
    return found


def offline_runs(directory: str | Path, *, finished: int = 0, timeout: float = 60.0) -> list[OfflineRun]:
    """Every run under ``directory`` (``wandb/offline-run-*/run-*.wandb``), by file name.

    ``finished``: wait (``timeout`` seconds at most) until that many runs hold their exit record. ``run.finish()``
    returns before W&B's own process has written everything to the file (CI once read a main run's file that held
    only its header); W&B's sync reads the files once that process is done with them.
    """
    deadline = time.monotonic() + timeout
    while True:
        runs = [read_run(path) for path in sorted(Path(directory).rglob("run-*.wandb"))]
        if sum(run.exit_code is not None for run in runs) >= finished or time.monotonic() > deadline:
            return runs
        time.sleep(0.1)
