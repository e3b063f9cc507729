"""The marker of a per-rank file that stopped early: a small JSON file written beside it, atomically."""

import contextlib
import datetime
import json
import os
import socket
from typing import Any

from lightning_ext._files.storage import guarded, join, split_location, write_whole

__all__ = [
    "FORMAT",
    "SUFFIX",
    "describe",
    "encode_marker",
    "marker_locations",
    "parse_marker",
    "read_rank_marker",
    "remove_markers",
    "write_marker",
]

SUFFIX = ".incomplete"
FORMAT = "lightning-ext per-rank metrics incomplete/1"


def marker_locations(log_dir: str, filename: str, rank: int) -> tuple[str, str]:
    """The marker beside the rank's file, and the fallback in the log directory itself (the same if no ``/``).

    Example:
        >>> marker_locations("logs", "rank_{rank}/metrics.csv", 1)
        ('logs/rank_1/metrics.csv.incomplete', 'logs/rank_1_metrics.csv.incomplete')

    """
    relative = filename.replace("{rank}", str(rank))
    return join(log_dir, relative + SUFFIX), join(log_dir, relative.replace("/", "_") + SUFFIX)


def write_marker(
    log_dir: str,
    filename: str,
    rank: int,
    *,
    file: str,
    reason: str,
    rows_written: int,
    last_step: int | None,
    kind: str = FORMAT,
) -> str:
    """Write the marker where it can be written; return where. Raises the last error if nowhere.

    ``kind`` is the marker's ``format`` (the decision record's differs from the per-rank files').
    """
    record = {
        "format": kind,
        "rank": rank,
        "file": file,
        "reason": reason,
        "rows_written": rows_written,
        "last_step": last_step,
        "stopped_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    data = encode_marker(record)
    failure: Exception | None = None
    for location in dict.fromkeys(marker_locations(log_dir, filename, rank)):
        with guarded() as attempt:  # the next location is tried (beside the file, then the log dir's top)
            write_whole(location, data)
            return location
        failure = attempt.error
    assert failure is not None  # the loop ran at least once, and each try failed
    raise failure


def read_rank_marker(log_dir: str, filename: str, rank: int) -> dict[str, Any] | None:
    """The marker of ``rank``'s file, if there is one (beside the file first, then the fallback)."""
    for location in dict.fromkeys(marker_locations(log_dir, filename, rank)):
        fs, path, _ = split_location(location)
        try:
            data = fs.cat_file(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        return parse_marker(data, location)
    return None


def remove_markers(log_dir: str, filename: str, rank: int) -> None:
    """Remove ``rank``'s markers (its file is whole again, or a new run starts it afresh)."""
    for location in dict.fromkeys(marker_locations(log_dir, filename, rank)):
        fs, path, _ = split_location(location)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            fs.rm_file(path)


def encode_marker(record: dict[str, Any]) -> bytes:
    """A marker's bytes: indented JSON, UTF-8, one trailing newline."""
    return (json.dumps(record, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def parse_marker(data: bytes, where: str) -> dict[str, Any]:
    """A marker's record; one that cannot be parsed still says the file is incomplete."""
    try:
        record = json.loads(data.decode("utf-8"))
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return {"reason": f"unreadable marker {where}", "rows_written": None, "last_step": None}
    return record


def describe(record: dict[str, Any]) -> str:
    """One line: how many rows were written, the last step, and why the rank stopped.

    Example:
        >>> describe({"reason": "OSError: disk full", "rows_written": 3, "last_step": 2})
        'stopped early after 3 row(s), the last at step 2: OSError: disk full'

    """
    rows, last = record.get("rows_written"), record.get("last_step")
    written = "" if rows is None else f" after {rows} row(s)" + ("" if last is None else f", the last at step {last}")
    return f"stopped early{written}: {record.get('reason', 'no reason recorded')}"
