"""The decision record: why each checkpoint was (not) saved and why training stopped, read into a pandas table."""

import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from lightning_ext._decisions.record_format import COLUMNS, FILENAME, check_one_run, decode_row
from lightning_ext._files.csv_format import decode, iter_records, split_header
from lightning_ext._files.durable import complete_prefix_length
from lightning_ext._files.markers import describe, read_rank_marker
from lightning_ext._files.parted_file import read_chunks
from lightning_ext._files.storage import glob_escape, join, split_location
from lightning_ext.errors import DecisionRecordError, DecisionRecordWarning, RankMetricsError

__all__ = ["DECISIONS_FILE", "read_decisions"]

DECISIONS_FILE = FILENAME
"""The record's file in the run's log directory."""

StrPath = str | os.PathLike[str]
_PER_RANK = ("values", "votes")


def read_decisions(
    log_dir: StrPath, *, run: str | None = None, per_rank: bool = False, allow_mixed: bool = False
) -> pd.DataFrame:
    """Read the decision record of a run: ``<log_dir>/decisions.csv`` (a path or an fsspec URL), written by rank 0.

    Args:
        log_dir: the run's log directory (``trainer.log_dir``).
        run: only the rows of this run (the ``run`` column), for a file that holds more than one.
        per_rank: one row per decision *and rank* (columns ``decision``, ``rank``, ``has_value``, ``value``,
            ``vote``, then the decision's columns) instead of one row per decision.
        allow_mixed: read a file whose rows come from more than one run (see Raises) instead of refusing it.

    Returns:
        One row per decision, in the order they were made: ``run``, ``step``, ``epoch``, ``time`` (UTC), ``callback``,
        ``monitor``, ``mode``, ``policy``, ``world_size``, ``outcome`` (``saved``/``not saved``, ``stop``/``go on``),
        ``values`` (every rank's value, a tuple in rank order: NaN kept, ``None`` where a rank lacks the metric),
        ``votes`` (a tuple of ``True``/``False``, ``None`` where a rank did not vote), ``yes``, ``agreed``,
        ``saved_as``, ``removed``, ``best_before``, ``best_after``, ``best_path_before``, ``best_path_after``,
        ``reason`` (``docs/decision-record.md``).

    Raises:
        FileNotFoundError: no such directory, or no record in it (the message says when one is written).
        DecisionRecordError: a malformed file (the message names the file, line and column), or (without
            ``allow_mixed``) rows of more than one run mixed in one file.

    A :class:`~lightning_ext.errors.DecisionRecordWarning` names a last line cut short by a crash (it is skipped) and a
    record that stopped early.

    Example:
        >>> import tempfile
        >>> read_decisions(tempfile.gettempdir() + "/no-such-run")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileNotFoundError: No such log directory: ...

    """
    found = read_record(os.fspath(log_dir), run=run, allow_mixed=allow_mixed)
    for note in found.notes:
        warnings.warn(note, DecisionRecordWarning, stacklevel=2)
    return _long(found.rows) if per_rank else _table(found.rows)


@dataclass
class Record:
    """The rows read (typed, in file order; ``cells``: as the file has them), and what was noticed on the way."""

    path: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    cells: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def runs(self) -> list[str]:
        """The runs in the file, in order of their first row."""
        return list(dict.fromkeys(row["run"] for row in self.rows))


def read_record(log_dir: str, *, run: str | None = None, allow_mixed: bool = False) -> Record:
    """The rows of ``<log_dir>/decisions.csv`` and its parts (what :func:`read_decisions` and the command read)."""
    fs, root, _ = split_location(log_dir)
    if not fs.isdir(root):
        raise FileNotFoundError(f"No such log directory: {log_dir}")
    path = join(log_dir, FILENAME)
    fs, where, local = split_location(path)
    chunks = read_chunks(fs, where)
    marker = read_rank_marker(log_dir, FILENAME, 0)
    if not chunks:
        stopped = "" if marker is None else f"; the record {describe(marker)}"
        names = [name.rsplit("/", 1)[-1] for name in fs.glob(glob_escape(where) + ".*")]
        earlier = sorted((name for name in names if name.rsplit(".", 1)[-1].isdigit()), key=len)
        also = f" (earlier runs' records here: {', '.join(earlier)})" if earlier else ""
        raise FileNotFoundError(
            f"No decision record under {log_dir}: there is no {FILENAME}{also}{stopped}. Rank 0 writes it when a"
            " ModelCheckpoint or EarlyStopping decides under a lightning-ext strategy whose trainer has a logger"
            " (decision_record=True, the default); the record is in that logger's directory (trainer.log_dir)."
        )
    record = Record(path)
    for name, data in chunks:
        _read_chunk(path if local or name == where else fs.unstrip_protocol(name), data, record)
    if marker is not None:
        record.notes.append(f"{path} is incomplete: the record {describe(marker)}")
    if run is not None:
        if run not in record.runs:
            raise ValueError(f"No run {run!r} in {path}; its runs: {', '.join(record.runs) or 'none'}")
        keep = [index for index, row in enumerate(record.rows) if row["run"] == run]
        record.rows, record.cells = [record.rows[i] for i in keep], [record.cells[i] for i in keep]
    if not allow_mixed:
        check_one_run(record.rows, path)
    return record


def _read_chunk(where: str, data: bytes, record: Record) -> None:
    complete = complete_prefix_length(data)
    if complete < len(data):
        line = data.count(b"\n") + 1
        record.notes.append(f"{where}, line {line}: ignored an incomplete last line (a write cut short)")
    try:
        header, body, first_line = split_header(decode(data[:complete], where), where)
        if not header:
            return
        missing = [name for name in COLUMNS if name not in header]
        if missing:
            raise DecisionRecordError(f"{where}, line 1: not a decision record: no column(s) {', '.join(missing)}")
        for line, found in iter_records(body, header, where, first_line):
            cells = dict(zip(header, found, strict=True))
            record.rows.append(decode_row(cells, where, line))
            record.cells.append(cells)
    except RankMetricsError as error:  # the shared CSV checks name the file and line
        raise DecisionRecordError(str(error)) from None


def _table(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    table = pd.DataFrame(list(rows), columns=list(COLUMNS))
    for name in ("step", "epoch", "world_size"):
        table[name] = table[name].astype("int64")
    table["yes"] = table["yes"].astype("Int64")
    for name in ("agreed", "best_before", "best_after"):
        table[name] = table[name].astype("float64")
    table["time"] = pd.to_datetime(table["time"], utc=True, errors="coerce", format="ISO8601")
    for name in ("saved_as", "removed", "best_path_before", "best_path_after"):
        table[name] = table[name].where(table[name] != "", None)
    return table


def _long(rows: list[dict[str, Any]]) -> pd.DataFrame:
    others = [name for name in COLUMNS if name not in _PER_RANK]
    per_rank = [
        {
            "decision": index,
            "rank": rank,
            "has_value": value is not None,
            "value": value,
            "vote": vote,
            **{name: row[name] for name in others},
        }
        for index, row in enumerate(rows)
        for rank, (value, vote) in enumerate(zip(row["values"], row["votes"], strict=True))
    ]
    table = _table([{**row, "values": (), "votes": ()} for row in per_rank]).drop(columns=list(_PER_RANK))
    long = pd.DataFrame(per_rank, columns=["decision", "rank", "has_value", "value", "vote"]).astype(
        {"decision": "int64", "rank": "int64", "has_value": "bool", "value": "float64", "vote": "boolean"}
    )
    return pd.concat([long, table], axis=1)
