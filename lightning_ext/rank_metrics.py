"""Per-rank metrics files: a crash-safe writer and a pandas reader, side by side.

Every rank writes its own ``<log_dir>/rank_<r>/metrics.csv`` (the relative path is the template
:data:`DEFAULT_FILENAME`; both sides accept another one with ``{rank}`` in it). The format is stock Lightning's
``metrics.csv`` (``CSVLogger``): ``csv`` module defaults (``\\r\\n`` line ends), a header with the sorted names of
every metric seen plus ``step``, one row per :meth:`RankMetricsWriter.log_metrics` call, empty cells for metrics not
logged in that call, numbers as the ``csv`` module writes Python ints and floats (``repr``, so floats read back
exactly). Given the same calls, the bytes are those that stock ``_ExperimentWriter`` writes.

Example:
    >>> import tempfile
    >>> log_dir = tempfile.TemporaryDirectory()
    >>> for rank in range(2):
    ...     with RankMetricsWriter.for_rank(log_dir.name, rank) as writer:
    ...         writer.log_metrics({"loss": 1.5 + rank, "epoch": 0}, step=0)
    ...         writer.log_metrics({"loss": 0.25 + rank, "acc": 0.5, "epoch": 1}, step=1)
    >>> read_rank_metrics(log_dir.name)
       rank  step  epoch  acc  loss
    0     0     0      0  NaN  1.50
    1     0     1      1  0.5  0.25
    2     1     0      0  NaN  2.50
    3     1     1      1  0.5  1.25
    >>> log_dir.cleanup()

"""

import contextlib
import csv
import numbers
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pandas as pd

from lightning_ext._durable import (
    append_all,
    complete_prefix_length,
    fsync_directory,
    open_for_append,
    replace_atomically,
)
from lightning_ext._metrics_csv import (
    EPOCH,
    RANK,
    STEP,
    RankMetricsError,
    check_header,
    check_metric_name,
    check_template,
    decode,
    encode_rows,
    find_rank_files,
    iter_records,
    read_rank_file,
    split_header,
    whole_number,
)

__all__ = [
    "DEFAULT_FILENAME",
    "PerRankMetrics",
    "RankMetricsError",
    "RankMetricsWriter",
    "rank_metrics_path",
    "read_rank_metrics",
]

DEFAULT_FILENAME = "rank_{rank}/metrics.csv"
"""Where a rank's file lives, relative to the log directory; ``{rank}`` is the global rank."""

StrPath = str | os.PathLike[str]
Cell = int | float


def rank_metrics_path(log_dir: StrPath, rank: int, *, filename: str = DEFAULT_FILENAME) -> Path:
    """The file of one rank.

    Example:
        >>> rank_metrics_path("logs", 3).as_posix()
        'logs/rank_3/metrics.csv'

    """
    check_template(filename)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a whole number >= 0, got {rank!r}")
    return Path(log_dir) / filename.replace("{rank}", str(rank))


@dataclass(frozen=True)
class PerRankMetrics:
    """Options of the per-rank metrics files (``PolicyDDPStrategy(per_rank_metrics=PerRankMetrics(...))``).

    Args:
        filename: the file of rank ``r``, relative to the run's log directory; ``{rank}`` is replaced by ``r``.
        flush_every_n_rows: rows kept in memory before they are written; a SIGKILL loses at most these.

    """

    filename: str = DEFAULT_FILENAME
    flush_every_n_rows: int = 100

    def __post_init__(self) -> None:
        if "{rank}" not in self.filename:
            raise ValueError(f"PerRankMetrics.filename must contain '{{rank}}', got {self.filename!r}")
        if os.path.isabs(self.filename):
            raise ValueError(f"PerRankMetrics.filename must be relative to the log directory, got {self.filename!r}")
        if self.flush_every_n_rows < 1:
            raise ValueError(f"PerRankMetrics.flush_every_n_rows must be >= 1, got {self.flush_every_n_rows}")


class RankMetricsWriter:
    """Writes one rank's metrics to a CSV file in stock Lightning's format, without ever losing a flushed row.

    Rows are kept in memory and written every ``flush_every_n_rows`` rows, on :meth:`flush` and on :meth:`close`
    (call it, or use the writer in a ``with`` block), each time with one ``os.write`` on an ``O_APPEND`` descriptor.
    A crash loses only the rows still in memory, fewer than ``flush_every_n_rows``: a ``SIGKILL`` keeps every row
    written so far (they are in the page cache), and a row cut short mid-write is removed when the file is next
    opened with ``resume_from_step``, and skipped by :func:`read_rank_metrics`. A metric name not yet in the header
    makes the writer write the whole file anew to a temporary file, ``fsync`` it and rename it over the old one, so a
    crash at any point leaves the old file or the new one, never a truncated one. :meth:`close` ``fsync``-s the file.

    If the file already exists:

    * ``resume_from_step=S`` (a run resumed from a checkpoint taken at logging step ``S``): rows with ``step <= S``
      are kept, later rows are dropped (the resumed run logs them again), and new rows are appended.
    * ``resume_from_step=None`` (a new run): nothing is deleted; the old file is renamed to ``metrics.csv.1`` (or
      ``.2``, ... the first free number; see :attr:`rotated_to`) and a new file is started.

    Args:
        path: the CSV file; its directory is created. See :meth:`for_rank` for the per-rank layout.
        flush_every_n_rows: how many rows to buffer before writing them (at least 1).
        resume_from_step: the logging step the run resumed from, or ``None`` for a new run.

    Raises:
        RankMetricsError: ``resume_from_step`` is given and the existing file cannot be read.

    """

    def __init__(self, path: StrPath, *, flush_every_n_rows: int = 100, resume_from_step: int | None = None) -> None:
        if isinstance(flush_every_n_rows, bool) or not isinstance(flush_every_n_rows, int) or flush_every_n_rows < 1:
            raise ValueError(f"flush_every_n_rows must be a whole number >= 1, got {flush_every_n_rows!r}")
        if resume_from_step is not None and (
            isinstance(resume_from_step, bool) or not isinstance(resume_from_step, int)
        ):
            raise TypeError(f"resume_from_step must be an int or None, got {resume_from_step!r}")
        self._path = Path(path)
        self._flush_every_n_rows = flush_every_n_rows
        self._buffer: list[dict[str, Cell]] = []
        self._fieldnames: list[str] = []  # the header now in the file; empty while the file has none
        self._checked_names: set[str] = set()
        self._rows_written = 0
        self._size = 0  # bytes in the file, to undo a partial append
        self._fd: int | None = None
        self._closed = False
        self._rotated_to: Path | None = None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(self._path):
            if resume_from_step is None:
                self._rotated_to = _rotate(self._path)
            else:
                self._resume(resume_from_step)

    @classmethod
    def for_rank(
        cls,
        log_dir: StrPath,
        rank: int,
        *,
        filename: str = DEFAULT_FILENAME,
        flush_every_n_rows: int = 100,
        resume_from_step: int | None = None,
    ) -> "RankMetricsWriter":
        """A writer for ``rank``'s file under ``log_dir`` (see :func:`rank_metrics_path`)."""
        path = rank_metrics_path(log_dir, rank, filename=filename)
        return cls(path, flush_every_n_rows=flush_every_n_rows, resume_from_step=resume_from_step)

    @property
    def path(self) -> Path:
        """The CSV file."""
        return self._path

    @property
    def rows_written(self) -> int:
        """Rows in the file: those kept on resume plus those flushed since; buffered rows are not counted."""
        return self._rows_written

    @property
    def rotated_to(self) -> Path | None:
        """Where an earlier run's file was moved to (``resume_from_step=None``), or ``None``."""
        return self._rotated_to

    def log_metrics(self, metrics: Mapping[str, Cell], step: int) -> None:
        """Buffer one row: ``metrics`` plus a ``step`` column; write the buffer if it is full.

        Raises:
            TypeError: ``step`` is not an int, a name is not a str, or a value is not an int or float.
            ValueError: a name is empty, reserved (``step``, ``rank``), or not encodable; the writer is closed.

        """
        self._check_open()
        if type(step) is not int and (isinstance(step, bool) or not isinstance(step, numbers.Integral)):
            raise TypeError(f"step must be an int, got {type(step).__name__} {step!r}")
        row = {name: self._cell(name, value, step) for name, value in metrics.items()}
        row[STEP] = int(step)
        self._buffer.append(row)
        if len(self._buffer) >= self._flush_every_n_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows now: appended, or with the whole file rewritten if they bring new names."""
        self._check_open()
        if not self._buffer:
            return
        names = set(self._fieldnames).union(*self._buffer)
        if self._fieldnames and len(names) == len(self._fieldnames):
            self._append_buffer()
            self._commit_buffer()
        else:
            self._rewrite_with_buffer(sorted(names))
            self._commit_buffer()
            fsync_directory(self._path.parent)

    def close(self) -> None:
        """Flush, ``fsync`` and close the file. Closing again does nothing."""
        if self._closed:
            return
        try:
            self.flush()
            if self._fd is not None:
                os.fsync(self._fd)
        finally:
            self._closed = True
            self._close_fd()

    def __enter__(self) -> "RankMetricsWriter":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"The metrics writer for {self._path} is closed")

    def _cell(self, name: str, value: Cell, step: int) -> Cell:
        if name not in self._checked_names:
            check_metric_name(name, step)
            self._checked_names.add(name)
        kind = type(value)
        if kind is float or kind is int:  # the usual case, checked without the (slower) ABC machinery
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"Metric {name!r} at step {step}: expected an int or a float, got {type(value).__name__} {value!r}"
                " (call .item() on a tensor)"
            )
        # plain int/float, so that NumPy scalars are written as numbers, not as "np.float64(...)"
        return int(value) if isinstance(value, numbers.Integral) else float(value)

    def _append_buffer(self) -> None:
        data = encode_rows(self._fieldnames, self._buffer, header=False)
        if self._fd is None:
            self._fd = open_for_append(self._path)
        try:
            append_all(self._fd, data)
        except BaseException:
            # never leave a partial row for the next append to glue onto
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)

    def _rewrite_with_buffer(self, fieldnames: list[str]) -> None:
        existing: list[dict[str, str]] = []
        if self._fieldnames:
            with self._path.open(newline="", encoding="utf-8") as handle:
                existing = list(csv.DictReader(handle))
        data = encode_rows(fieldnames, [*existing, *self._buffer], header=True)
        replace_atomically(self._path, data)
        self._close_fd()  # it points to the replaced file
        self._fieldnames = fieldnames
        self._size = len(data)

    def _commit_buffer(self) -> None:
        self._rows_written += len(self._buffer)
        self._buffer = []

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _resume(self, last_step: int) -> None:
        data = self._path.read_bytes()
        complete = complete_prefix_length(data)
        if complete < len(data):
            warnings.warn(f"{self._path}: removed an incomplete last line (a write cut short)", RuntimeWarning, 3)
            self._fd = open_for_append(self._path)
            os.ftruncate(self._fd, complete)
            os.fsync(self._fd)
            data = data[:complete]
        header, body, first_line = split_header(decode(data, self._path), self._path)
        self._size = len(data)
        if not header:
            return
        check_header(header, self._path)
        records = list(iter_records(body, header, self._path, first_line))
        at = header.index(STEP)
        kept = [
            dict(zip(header, record, strict=True))
            for line, record in records
            if whole_number(record[at], self._path, line, STEP) <= last_step
        ]
        if len(kept) < len(records):
            data = encode_rows(header, kept, header=True)
            replace_atomically(self._path, data)
            self._close_fd()
            fsync_directory(self._path.parent)
            self._size = len(data)
        self._fieldnames = header
        self._rows_written = len(kept)


def read_rank_metrics(log_dir: StrPath, *, filename: str = DEFAULT_FILENAME) -> pd.DataFrame:
    """Read every rank's metrics file under ``log_dir`` into one long table.

    Args:
        log_dir: the directory holding the per-rank files.
        filename: the files' path relative to ``log_dir``, with ``{rank}`` for the rank.

    Returns:
        One row per logged row, ordered by rank then file order. Columns: ``rank`` and ``step`` (int64), ``epoch``
        (nullable Int64; all missing where no file has it), then one float64 column per metric, sorted by name. A
        metric that a rank never logged is NaN on that rank's rows.

    Raises:
        FileNotFoundError: ``log_dir`` does not exist, or holds no per-rank file.
        RankMetricsError: a file is malformed (the message names the file, line, and column where it applies).

    A last line cut short by a crash is skipped with a ``RuntimeWarning`` that names the file.

    """
    check_template(filename)
    root = Path(log_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"No such log directory: {root}")
    found = find_rank_files(root, filename)
    if not found:
        raise FileNotFoundError(f"No {filename.replace('{rank}', '<r>')} was found under {root}")
    frames = []
    for rank, path in found:
        frame = read_rank_file(path)
        frame.insert(0, RANK, rank)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    metrics = sorted(set(table.columns) - {RANK, STEP, EPOCH})
    dtypes = {RANK: "int64", STEP: "int64", EPOCH: "Int64", **dict.fromkeys(metrics, "float64")}
    return table[[RANK, STEP, EPOCH, *metrics]].astype(dtypes)


def _rotate(path: Path) -> Path:
    number = 1
    while os.path.lexists(rotated := path.with_name(f"{path.name}.{number}")):
        number += 1
    os.rename(path, rotated)
    fsync_directory(path.parent)
    return rotated
