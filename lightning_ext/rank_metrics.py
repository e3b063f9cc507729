"""Per-rank metrics files: a crash-safe writer and a pandas reader, side by side (``docs/per-rank-metrics.md``)."""

import os
import warnings
from collections.abc import Iterable
from typing import Literal

import pandas as pd

from lightning_ext._files.csv_format import check_template
from lightning_ext._files.markers import describe
from lightning_ext._per_rank.writer import (
    DEFAULT_FILENAME,
    PerRankMetrics,
    RankMetricsWriter,
    StrPath,
    rank_metrics_path,
)
from lightning_ext._reading.log_dir_files import list_rank_files
from lightning_ext._reading.reader import ReadReport, Request, read_table
from lightning_ext.errors import MixedRunsError, RankMetricsError, RankMetricsWarning

__all__ = [
    "DEFAULT_FILENAME",
    "MixedRunsError",
    "PerRankMetrics",
    "RankMetricsError",
    "RankMetricsWarning",
    "RankMetricsWriter",
    "incomplete_ranks",
    "rank_metrics_path",
    "read_rank_hosts",
    "read_rank_metrics",
]


def read_rank_metrics(
    log_dir: StrPath,
    *,
    filename: str = DEFAULT_FILENAME,
    metrics: Iterable[str] | None = None,
    ranks: Iterable[int] | None = None,
    min_step: int | None = None,
    max_step: int | None = None,
    skip_bad_files: bool = False,
    allow_mixed: bool = False,
    engine: Literal["pyarrow", "pandas"] | None = None,
) -> pd.DataFrame:
    """Read every rank's metrics file under ``log_dir`` (a path or an fsspec URL) into one long table.

    Args:
        log_dir: the directory holding the per-rank files.
        filename: the files' path relative to ``log_dir``, with ``{rank}`` for the rank.
        metrics: only these metric columns (as the files name them, e.g. ``"metric:rank"``); ``None``: all.
        ranks: only these ranks' files; ``None``: every rank found.
        min_step: only rows with ``step >= min_step``. ``max_step``: only rows with ``step <= max_step``.
        skip_bad_files: leave out a rank whose file is malformed or unreadable (with a warning) instead of raising.
        allow_mixed: read files that come from more than one run (see Raises) instead of refusing them.
        engine: ``"pyarrow"`` (the ``fast`` extra; the default where installed) or ``"pandas"``: the same results.

    Returns:
        One row per logged row, ordered by rank then file order. Columns: ``rank`` and ``step`` (int64), ``epoch``
        (nullable Int64; all missing where no file has it), then one float64 column per metric column of the files
        (or per name in ``metrics``), sorted by name (a metric named ``rank`` or ``step`` is the column
        ``metric:rank`` or ``metric:step``). A metric that a rank never logged is NaN on that rank's rows.

    Raises:
        FileNotFoundError: ``log_dir`` does not exist, holds no per-rank file, or has no file for a rank in ``ranks``.
        RankMetricsError: a file is malformed (the message names the file, line, and column where it applies), or
            (:class:`MixedRunsError`) the files come from more than one run (``docs/per-rank-metrics.md``).
        ValueError: a name in ``metrics`` is in no file; ``min_step > max_step``; an unknown ``engine``.
        TypeError: ``metrics`` is a single str, or a rank or step is not an int.

    A :class:`RankMetricsWarning` names each rank whose file stopped early (see :func:`incomplete_ranks`), each last
    line cut short by a crash (that line is skipped), and each file skipped with ``skip_bad_files``.

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
        >>> read_rank_metrics(log_dir.name, metrics=["loss"], ranks=[1], min_step=1)  # read less
           rank  step  epoch  loss
        0     1     1      1  1.25
        >>> incomplete_ranks(log_dir.name)
        {}
        >>> log_dir.cleanup()

    """
    check_template(filename)
    how = {"skip_bad_files": skip_bad_files, "allow_mixed": allow_mixed, "engine": engine}
    request = Request.checked(metrics, ranks, min_step, max_step, **how)
    report = ReadReport()
    try:
        return read_table(os.fspath(log_dir), filename, request, report)
    finally:  # what was found before an error too
        for _, note in report.notes:
            warnings.warn(note, RankMetricsWarning, stacklevel=2)


def incomplete_ranks(log_dir: StrPath, *, filename: str = DEFAULT_FILENAME) -> dict[int, str]:
    """The ranks whose per-rank output stopped early, each with why: ``{rank: "stopped early after ...: reason"}``.

    A rank's output stops when its file could not be written (a full or unwritable disk, an unreachable store) or
    its local values could not be computed; training went on, and the per-rank logger left a marker (see
    ``docs/per-rank-metrics.md``). A rank killed outright (``SIGKILL``) leaves no marker: compare the ranks' last
    steps for that.

    Raises:
        FileNotFoundError: ``log_dir`` does not exist.

    """
    check_template(filename)
    return {
        rank: describe(record) for rank, (record, _) in list_rank_files(os.fspath(log_dir), filename).read_markers()
    }


def read_rank_hosts(log_dir: StrPath, *, filename: str = DEFAULT_FILENAME) -> pd.DataFrame:
    """Where each rank ran, from the host records that per-rank telemetry writes beside the files.

    Returns:
        One row per rank with a readable record (index ``rank``, sorted): ``host``, ``host_memory_bytes`` (the
        host's total memory), ``pid``, ``cpu_count``. Empty where telemetry was off.

    Raises:
        FileNotFoundError: ``log_dir`` does not exist.

    Example:
        >>> import json, tempfile
        >>> log_dir = tempfile.TemporaryDirectory()
        >>> with RankMetricsWriter.for_rank(log_dir.name, 0) as writer:
        ...     writer.log_metrics({"loss": 1.0}, step=0)
        >>> record = {"host": "node-7", "host_memory_bytes": 2**30, "pid": 11, "cpu_count": 8}
        >>> with open(rank_metrics_path(log_dir.name, 0) + ".host", "w") as file:
        ...     _ = file.write(json.dumps(record))
        >>> read_rank_hosts(log_dir.name)
                host  host_memory_bytes  pid  cpu_count
        rank
        0     node-7         1073741824   11          8
        >>> log_dir.cleanup()

    """
    check_template(filename)
    found = list_rank_files(os.fspath(log_dir), filename)
    records = found.read_hosts(sorted(found.hosts))
    columns = ["host", "host_memory_bytes", "pid", "cpu_count"]
    frame = pd.DataFrame([[record.get(name) for name in columns] for record in records.values()], columns=columns)
    frame.index = pd.Index(list(records), name="rank", dtype="int64")
    return frame
