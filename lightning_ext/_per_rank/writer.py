"""Writing one rank's metrics file: ``RankMetricsWriter``, and the strategy's ``PerRankMetrics`` options."""

import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType

from lightning_ext._files.csv_format import STEP, check_metric_name, check_template, column_name
from lightning_ext._files.file_output import storage_for
from lightning_ext._files.storage import join

__all__ = ["DEFAULT_FILENAME", "PerRankMetrics", "RankMetricsWriter", "rank_metrics_path"]

DEFAULT_FILENAME = "rank_{rank}/metrics.csv"
"""Where a rank's file lives, relative to the log directory; ``{rank}`` is the global rank."""

StrPath = str | os.PathLike[str]
Cell = int | float


def rank_metrics_path(log_dir: StrPath, rank: int, *, filename: str = DEFAULT_FILENAME) -> str:
    """The file of one rank (a path, or a URL if ``log_dir`` is one).

    Example:
        >>> rank_metrics_path("logs", 3)
        'logs/rank_3/metrics.csv'
        >>> rank_metrics_path("s3://bucket/run", 0)
        's3://bucket/run/rank_0/metrics.csv'

    """
    check_template(filename)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a whole number >= 0, got {rank!r}")
    return join(os.fspath(log_dir), filename.replace("{rank}", str(rank)))


@dataclass(frozen=True)
class PerRankMetrics:
    """Options of the per-rank metrics files (``PolicyDDPStrategy(per_rank_metrics=PerRankMetrics(...))``).

    Args:
        filename: the file of rank ``r``, relative to the run's log directory; ``{rank}`` is replaced by ``r``.
        flush_every_n_rows: rows kept in memory before they are written; a SIGKILL loses at most these. On an object
            store each flush is one object write (see ``docs/per-rank-metrics.md``).
        telemetry: also write, in ``telemetry/*`` columns, the rank's time per training batch by phase (data wait,
            forward, backward, optimizer, collectives) and its memory (process, DataLoader workers, host, CUDA),
            and the rank's host beside its file; no collective is added (``docs/per-rank-metrics.md``).
        telemetry_every_n_steps: a telemetry row every this many steps, holding the means over the batches since the
            last one; ``None``: the trainer's ``log_every_n_steps``.
        tensorboard: for each ``TensorBoardLogger`` of the trainer, also write every row (and the telemetry) to
            TensorBoard event files in its ``<log_dir>/rank_<r>/``: one run per rank, over the synced one.
        mlflow: for each ``MLFlowLogger``, also log every row (and the telemetry) to a child run ``rank_<r>`` of its
            run, with the same keys, steps and tracking URI (``pip install 'lightning-ext[mlflow]'``).
        wandb: for each ``WandbLogger``, also log every row (and the telemetry) to a run ``rank_<r>`` of its project,
            grouped under the main run's id (``pip install 'lightning-ext[wandb]'``; offline as online).
        straggler_window: with telemetry, during ``fit``, every this many telemetry rows rank 0 asks every rank's
            watchdog for its latest this many rows and warns (``StragglerWarning``) when the others have been
            waiting for one rank in most of them; ``None``: no live check (the verdict after the run is the same).
        straggler_reminder_minutes: a straggler already warned about is warned about again at most this often.

    """

    filename: str = DEFAULT_FILENAME
    flush_every_n_rows: int = 100
    telemetry: bool = False
    telemetry_every_n_steps: int | None = None
    tensorboard: bool = True
    mlflow: bool = True
    wandb: bool = True
    straggler_window: int | None = 10
    straggler_reminder_minutes: float = 30.0

    def __post_init__(self) -> None:
        if "{rank}" not in self.filename:
            raise ValueError(f"PerRankMetrics.filename must contain '{{rank}}', got {self.filename!r}")
        if os.path.isabs(self.filename) or "://" in self.filename:
            raise ValueError(f"PerRankMetrics.filename must be relative to the log directory, got {self.filename!r}")
        check_template(self.filename)
        if self.flush_every_n_rows < 1:
            raise ValueError(f"PerRankMetrics.flush_every_n_rows must be >= 1, got {self.flush_every_n_rows}")
        if not isinstance(self.telemetry, bool):
            raise TypeError(f"PerRankMetrics.telemetry must be True or False, got {self.telemetry!r}")
        for switch in ("tensorboard", "mlflow", "wandb"):
            if not isinstance(getattr(self, switch), bool):
                raise TypeError(f"PerRankMetrics.{switch} must be True or False, got {getattr(self, switch)!r}")
        window = self.straggler_window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 2):
            raise ValueError(f"PerRankMetrics.straggler_window must be a whole number >= 2 or None, got {window!r}")
        reminder = self.straggler_reminder_minutes
        if isinstance(reminder, bool) or not isinstance(reminder, (int, float)) or not reminder >= 0:
            raise ValueError(
                f"PerRankMetrics.straggler_reminder_minutes must be a number of minutes >= 0, got {reminder!r}"
            )
        every = self.telemetry_every_n_steps
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(
                f"PerRankMetrics.telemetry_every_n_steps must be a whole number >= 1 or None, got {every!r}"
            )


class RankMetricsWriter:
    """Writes one rank's metrics to a CSV file in stock Lightning's format, without ever losing a flushed row.

    Rows are kept in memory and written every ``flush_every_n_rows`` rows, on :meth:`flush` and on :meth:`close`
    (call it, or use the writer in a ``with`` block).

    On a local disk (a path or a ``file://`` URL) each flush is one ``os.write`` on an ``O_APPEND`` descriptor. A
    crash loses only the rows still in memory, fewer than ``flush_every_n_rows``: a ``SIGKILL`` keeps every row
    written so far (they are in the page cache), and a row cut short mid-write is removed when the file is next
    opened with ``resume_from_step``, and skipped by :func:`read_rank_metrics`. A metric name not yet in the header
    makes the writer write the whole file anew to a temporary file, ``fsync`` it and rename it over the old one, so a
    crash at any point leaves the old file or the new one, never a truncated one. :meth:`close` ``fsync``-s the file.

    On other fsspec filesystems (object stores have no append, rename or ``fsync``) each flush writes one new object,
    ``<file>.part-<token>-<n>``, holding a header and the flushed rows; :meth:`close` merges the parts into the file
    and deletes them. A crash loses the rows in memory; the parts written so far are read by :func:`read_rank_metrics`
    and merged when the file is next opened.

    If the file already exists:

    * ``resume_from_step=S`` (a run resumed from a checkpoint taken at logging step ``S``): rows with ``step <= S``
      are kept, later rows are dropped (the resumed run logs them again), and new rows are appended.
    * ``resume_from_step=None`` (a new run): nothing is deleted; the old file is renamed to ``metrics.csv.1`` (or
      ``.2``, ... the first free number; see :attr:`rotated_to`) and a new file is started.

    Args:
        path: the CSV file (a path or an fsspec URL); its directory is created. See :meth:`for_rank`.
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
        self._path = os.fspath(path)
        self._flush_every_n_rows = flush_every_n_rows
        self._buffer: list[dict[str, Cell]] = []
        self._columns: dict[str, str] = {}  # every metric name checked so far -> its column
        self._reserved_prefix: str | None = None
        self._closed = False
        self._storage = storage_for(self._path)
        start = self._storage.start(resume_from_step)
        self._fieldnames = start.fieldnames  # the header now in the file; empty while the file has none
        self._rows_written = start.rows
        self._rotated_to = start.rotated_to
        self._last_step: int | None = None

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
    def path(self) -> str:
        """The CSV file, as given (a path or a URL)."""
        return self._path

    @property
    def rows_written(self) -> int:
        """Rows in the file: those kept on resume plus those flushed since; buffered rows are not counted."""
        return self._rows_written

    @property
    def last_step_written(self) -> int | None:
        """The step of the last row this writer flushed, or ``None`` before its first flush."""
        return self._last_step

    @property
    def rotated_to(self) -> str | None:
        """Where an earlier run's file was moved to (``resume_from_step=None``), or ``None``."""
        return self._rotated_to

    def log_metrics(self, metrics: Mapping[str, Cell], step: int) -> None:
        """Buffer one row: ``metrics`` plus a ``step`` column; write the buffer if it is full.

        A metric named ``step`` or ``rank`` (or starting with ``metric:``) goes to the column ``metric:<name>``.

        Raises:
            TypeError: ``step`` is not an int, a name is not a str, or a value is not an int or float.
            ValueError: a name is empty or not encodable; the writer is closed.

        """
        if self._closed:
            raise ValueError(f"The metrics writer for {self._path} is closed")
        if type(step) is not int:
            if isinstance(step, bool) or not isinstance(step, numbers.Integral):
                raise TypeError(f"step must be an int, got {type(step).__name__} {step!r}")
            step = int(step)
        columns = self._columns
        row: dict[str, Cell] = {}
        for name, value in metrics.items():
            column = columns.get(name)
            if column is None:
                column = self._check_name(name, step)
            kind = type(value)
            row[column] = value if kind is float or kind is int else _number(name, value, step)
        row[STEP] = step
        self._buffer.append(row)
        if len(self._buffer) >= self._flush_every_n_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows now: appended, or with the whole file rewritten if they bring new names."""
        if self._closed:
            raise ValueError(f"The metrics writer for {self._path} is closed")
        buffer = self._buffer
        if not buffer:
            return
        names = set(self._fieldnames).union(*buffer)
        new_header = len(names) != len(self._fieldnames)
        fieldnames = sorted(names) if new_header else self._fieldnames
        self._storage.write(fieldnames, buffer, new_header=new_header)
        self._fieldnames = fieldnames
        self._rows_written += len(buffer)
        self._last_step = int(buffer[-1][STEP])
        self._buffer = []
        self._storage.settle()

    def close(self) -> None:
        """Flush, ``fsync`` (or merge the parts) and close the file. Closing again does nothing."""
        if self._closed:
            return
        try:
            self.flush()
            self._storage.close()
        finally:
            self._closed = True
            self._storage.discard()

    def __enter__(self) -> "RankMetricsWriter":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def reserve(self, prefix: str) -> None:
        """Metric names starting with ``prefix`` go to ``metric:<name>`` from now on: those columns are the caller's
        own, written with :meth:`log_columns` (per-rank telemetry's ``telemetry/`` columns)."""
        self._reserved_prefix = prefix
        self._columns = {name: column_name(name, prefix) for name in self._columns}

    def log_columns(self, row: Mapping[str, Cell], step: int) -> None:
        """Buffer one row whose keys are columns as they are written (no escaping: telemetry's ``telemetry/*`` and
        ``epoch``) and whose values are ints or floats."""
        if self._closed:
            raise ValueError(f"The metrics writer for {self._path} is closed")
        self._buffer.append({**row, STEP: step})
        if len(self._buffer) >= self._flush_every_n_rows:
            self.flush()

    def _check_name(self, name: str, step: int) -> str:
        check_metric_name(name, step)
        column = self._columns[name] = column_name(name, self._reserved_prefix)
        return column


def _number(name: str, value: object, step: int) -> Cell:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"Metric {name!r} at step {step}: expected an int or a float, got {type(value).__name__} {value!r}"
            " (call .item() on a tensor)"
        )
    # plain int/float, so that NumPy scalars are written as numbers, not as "np.float64(...)"
    return int(value) if isinstance(value, numbers.Integral) else float(value)
