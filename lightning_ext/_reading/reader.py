"""Every rank's file read into one table: in order, in bounded memory, only what was asked for, with a report."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from lightning_ext._files.csv_format import (
    EPOCH,
    RANK,
    STEP,
    check_header,
    check_template,
    whole_numbers,
)
from lightning_ext._files.markers import describe
from lightning_ext._files.parted_file import read_chunks
from lightning_ext._rank_lists import ranks_text
from lightning_ext._reading.fast_csv import ENGINES, SplitFile, default_engine, parse_exact, parse_pieces, split_file
from lightning_ext._reading.log_dir_files import RankFiles, list_rank_files
from lightning_ext._reading.long_table import Columns
from lightning_ext._reading.same_run import RankInfo, check_one_run, check_rotations
from lightning_ext.errors import RankMetricsError

__all__ = ["ReadReport", "Request", "read_table"]


@dataclass(frozen=True)
class Request:
    """What to read (some metrics, some ranks, a step range; ``None``: all) and how; checked by :meth:`checked`."""

    metrics: tuple[str, ...] | None = None
    ranks: tuple[int, ...] | None = None
    min_step: int | None = None
    max_step: int | None = None
    skip_bad_files: bool = False
    allow_mixed: bool = False
    engine: str | None = None
    present_only: bool = False  # names in ``metrics`` that no file has are left out, not an error

    @classmethod
    def checked(
        cls,
        metrics: Iterable[str] | None = None,
        ranks: Iterable[int] | None = None,
        min_step: int | None = None,
        max_step: int | None = None,
        **how: Any,
    ) -> "Request":
        """A request from the reader's keyword arguments; ``TypeError``/``ValueError`` that say what is wrong."""
        if isinstance(metrics, str):
            raise TypeError(f"metrics must be a list of metric names, not a str: use metrics=[{metrics!r}]")
        names = None if metrics is None else tuple(dict.fromkeys(metrics))
        for name in names or ():
            if not isinstance(name, str):
                raise TypeError(f"metrics must be metric names (str), got {type(name).__name__} {name!r}")
            if name in (RANK, STEP, EPOCH):
                raise ValueError(f"metrics: {name!r} is always read; list metric columns only")
        chosen = None if ranks is None else tuple(sorted(set(ranks)))
        for rank in chosen or ():
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise TypeError(f"ranks must be whole numbers >= 0, got {rank!r}")
        for label, step in (("min_step", min_step), ("max_step", max_step)):
            if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
                raise TypeError(f"{label} must be an int or None, got {type(step).__name__} {step!r}")
        if min_step is not None and max_step is not None and min_step > max_step:
            raise ValueError(f"min_step ({min_step}) is greater than max_step ({max_step}): no step is in that range")
        return cls(names, chosen, min_step, max_step, **how)


@dataclass
class ReadReport:
    """What the read found besides the rows: notes (warnings, in order), incomplete and skipped ranks, every rank."""

    notes: list[tuple[str, str]] = field(default_factory=list)  # (kind, message): "incomplete", "torn", "skipped"
    incomplete: dict[int, str] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)  # rank -> why its file was left out
    ranks: dict[int, RankInfo] = field(default_factory=dict)  # every rank read (not the skipped ones)
    listed: list[int] = field(default_factory=list)  # every rank with a file, selected or not
    rotated: dict[int, list[str]] = field(default_factory=dict)  # earlier runs' files, shown

    @property
    def missing(self) -> list[int]:
        """Ranks below the highest one found that have neither a file nor a marker."""
        known = set(self.listed) | set(self.incomplete)
        return [rank for rank in range(max(known, default=-1) + 1) if rank not in known]


def read_table(log_dir: str, filename: str, request: "Request", report: ReadReport) -> pd.DataFrame:
    """The long table of :func:`lightning_ext.rank_metrics.read_rank_metrics`; ``report`` is filled on the way."""
    check_template(filename)
    engine = _checked_engine(request.engine)
    found = list_rank_files(log_dir, filename)
    for rank, (record, path) in found.read_markers():
        report.incomplete[rank] = describe(record)
        where = found.shown(found.files[rank]) if rank in found.files else record.get("file", found.shown(path))
        note = f"rank {rank}: {where} is incomplete: {describe(record)} (marker: {found.shown(path)})"
        report.notes.append(("incomplete", note))
    if not found.ranks:
        raise FileNotFoundError(f"No {filename.replace('{rank}', '<r>')} was found under {log_dir}")
    report.listed = found.ranks
    ranks = _selected_ranks(found, request, log_dir)
    report.rotated = {rank: [found.shown(path) for path in found.rotated.get(rank, [])] for rank in ranks}
    if not request.allow_mixed:
        check_rotations({rank: found.shown(found.files[rank]) for rank in ranks}, report.rotated, log_dir)
    expected = sum(
        found.sizes.get(path, 0) for rank in ranks for path in [found.files[rank], *found.parts.get(rank, [])]
    )
    reader = _Reader(request, engine, report, expected)
    for rank in ranks:
        try:
            chunks = read_chunks(found.fs, found.files[rank], found.parts.get(rank, []))
            if not chunks:  # listed, then gone (or a dangling link)
                raise FileNotFoundError(f"No such file: {found.shown(found.files[rank])}")
        except OSError as error:
            reader.bad(rank, error, f"{found.shown(found.files[rank])}: cannot be read: {error}")
            continue
        for path, data in chunks:
            reader.add(rank, found.shown(path), data)
    for rank in ranks:
        if rank not in report.skipped:
            file = found.shown(found.files[rank])
            report.ranks[rank] = _info(file, reader.headers.get(rank), reader.steps.get(rank, []))
    if not request.allow_mixed:
        check_one_run(report.ranks, log_dir)
    metrics = sorted(set().union(*(info.metrics for info in report.ranks.values())))
    if request.metrics is not None:
        unknown = [name for name in request.metrics if name not in metrics]
        if unknown and not request.present_only:
            listed = ", ".join(repr(name) for name in metrics) or "none"
            raise ValueError(f"Unknown metric(s) {', '.join(map(repr, unknown))}; the metrics are: {listed}")
        metrics = sorted(name for name in request.metrics if name not in unknown)
    return reader.columns.frame(metrics)


def _checked_engine(engine: str | None) -> str:
    if engine is None:
        return default_engine()
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(map(repr, ENGINES))} or None, got {engine!r}")
    if engine == "pyarrow" and default_engine() != "pyarrow":
        raise ImportError("engine='pyarrow' needs pyarrow: pip install 'lightning-ext[fast]'")
    return engine


def _selected_ranks(found: RankFiles, request: Request, log_dir: str) -> list[int]:
    if request.ranks is None:
        return found.ranks
    absent = [rank for rank in request.ranks if rank not in found.files]
    if absent:
        raise FileNotFoundError(
            f"No file for {ranks_text(absent, None)} under {log_dir} (the ranks with a file:"
            f" {ranks_text(found.ranks, None).split(' ', 1)[1]})"
        )
    return list(request.ranks)


class _Reader:
    """Files in the table's order, each parsed, checked, cut to the step range and written to the columns."""

    def __init__(self, request: Request, engine: str, report: ReadReport, expected_bytes: int) -> None:
        self._request = request
        self._engine = engine
        self._report = report
        self._expected_bytes = expected_bytes
        self.columns = Columns()
        self.headers: dict[int, list[list[str]]] = {}  # rank -> the header of each file or part read
        self.steps: dict[int, list[_Steps]] = {}  # rank -> the steps of each file or part read

    def add(self, rank: int, where: str, data: bytes) -> None:
        """Read one file (or part) of ``rank``, after the ones before it."""
        if rank in self._report.skipped:
            return
        if data and not data.endswith(b"\n"):
            line = data.count(b"\n") + 1
            note = f"{where}, line {line}: ignored an incomplete last line (a write cut short)"
            self._report.notes.append(("torn", note))
        try:
            split = split_file(data, where)
            if not split.header:
                return
            check_header(split.header, where)
            self.headers.setdefault(rank, []).append(split.header)
            columns = self._columns(split.header)
            try:
                values = parse_pieces(split, columns, self._engine)
                _check_whole(split, columns, values)
            except RankMetricsError:
                # the exact path names the problem as the row-by-row checks see it (a blank line is a row without
                # fields there, a missing step to the engines)
                values = [[array] for array in parse_exact(split, columns)]
                _check_whole(split, columns, values)
        except RankMetricsError as error:
            self.bad(rank, error, str(error))
            return
        rows = sum(len(piece) for piece in values[0])
        if self.columns.capacity == 0 and rows:
            # the first rows tell how many bytes a row takes: room for every file's rows, give or take
            self.columns.reserve(int(self._expected_bytes / ((split.end - split.start) / rows) * 1.05) + 16)
        self._write(rank, dict(zip(columns, values, strict=True)))

    def bad(self, rank: int, error: Exception, message: str) -> None:
        """A file that cannot be read: raise, or (``skip_bad_files``) leave its rank out and say why."""
        if not self._request.skip_bad_files:
            raise error
        self._report.skipped[rank] = message
        self._report.notes.append(("skipped", f"rank {rank}: skipped: {message}"))
        self.columns.drop_rank(rank)

    def _columns(self, header: list[str]) -> list[str]:
        wanted = self._request.metrics
        metrics = [name for name in header if name not in (STEP, EPOCH) and (wanted is None or name in wanted)]
        return [STEP, *([EPOCH] if EPOCH in header else []), *metrics]

    def _write(self, rank: int, values: dict[str, list[NDArray[Any]]]) -> None:
        """Note the rank's steps, keep the rows in the step range, and write them; ``values``: pieces per column."""
        steps = [piece.astype(np.int64, copy=False) for piece in values[STEP] if len(piece)]
        if steps:
            count = sum(len(piece) for piece in steps)
            self.steps.setdefault(rank, []).append(_Steps(count, int(steps[0][0]), int(steps[-1][-1])))
        values[STEP] = steps
        low, high = self._request.min_step, self._request.max_step
        if low is not None or high is not None:
            joined = {name: np.concatenate(pieces) if pieces else np.empty(0) for name, pieces in values.items()}
            every = joined[STEP].astype(np.int64)
            keep = np.ones(len(every), dtype=bool)
            if low is not None:
                keep &= every >= low
            if high is not None:
                keep &= every <= high
            values = {name: [column[keep]] for name, column in joined.items()}
            values[STEP] = [every[keep]]
        self.columns.append(rank, values)


def _check_whole(split: SplitFile, columns: Sequence[str], values: list[list[NDArray[Any]]]) -> None:
    """``step`` and ``epoch`` cells that the engine read as floats must be whole (``epoch`` may be missing)."""
    for name, pieces in zip(columns, values, strict=True):
        line = split.first_line
        for piece in pieces:
            if name in (STEP, EPOCH) and piece.dtype.kind == "f":
                whole_numbers(piece, name, split.where, line, allow_missing=name == EPOCH)
            line += len(piece)


class _Steps(NamedTuple):
    """The steps of one file or part read: how many rows, the first and the last step."""

    rows: int
    first: int
    last: int


def _info(file: str, headers: list[list[str]] | None, steps: list[_Steps]) -> RankInfo:
    names = {name for header in headers or [] for name in header if name not in (STEP, EPOCH)}
    return RankInfo(
        file=file,
        rows=sum(part.rows for part in steps),
        first_step=steps[0].first if steps else None,
        last_step=steps[-1].last if steps else None,
        metrics=frozenset(names),
        has_header=bool(headers),
    )
