"""The per-rank ``metrics.csv`` format: rows encoded as stock Lightning does, and a file's text parsed and checked.

Both sides of :mod:`lightning_ext.rank_metrics` use these, so that what the writer writes is exactly what the reader
accepts. Data rows hold numbers only, so each is one line; only metric names in the header may be quoted and span
lines. Every error names the file, and the line (and column) where it applies.

Example:
    >>> encode_rows(["loss", "step"], [{"loss": 0.5, "step": 0}, {"step": 1}], header=True)
    b'loss,step\\r\\n0.5,0\\r\\n,1\\r\\n'
    >>> split_header('"a,\\nb",step\\r\\n1,0\\r\\n', Path("f.csv"))
    (['a,\\nb', 'step'], '1,0\\r\\n', 3)

"""

import csv
import io
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from lightning_ext._durable import complete_prefix_length

__all__ = [
    "EPOCH",
    "NA_CELLS",
    "RANK",
    "STEP",
    "RankMetricsError",
    "check_header",
    "check_metric_name",
    "check_template",
    "decode",
    "encode_rows",
    "find_rank_files",
    "iter_records",
    "parse_body",
    "read_rank_file",
    "split_header",
    "whole_number",
    "whole_numbers",
]

STEP, EPOCH, RANK = "step", "epoch", "rank"
NA_CELLS = ["", "nan"]  # an empty cell (metric not logged in that call) and a logged NaN both read as NaN

Cell = int | float | str


class RankMetricsError(ValueError):
    """A per-rank metrics file is not in the expected format; the message names the file, line and column."""


def encode_rows(fieldnames: list[str], rows: Sequence[Mapping[str, Cell]], *, header: bool) -> bytes:
    """``rows`` as ``csv.DictWriter`` writes them (excel dialect, empty cells for missing names), in UTF-8."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fieldnames)
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")


def decode(data: bytes, path: Path) -> str:
    """The file's text; ``RankMetricsError`` naming the line if it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise RankMetricsError(f"{path}, line {line}: not UTF-8 text ({error.reason})") from None


def split_header(text: str, path: Path) -> tuple[list[str], str, int]:
    """The header's names (``[]`` for an empty file), the text after it, and the line number where that starts."""
    stream = io.StringIO(text, newline="")
    reader = csv.reader(stream, strict=True)
    try:
        header = next(reader, [])
    except csv.Error as error:
        raise RankMetricsError(f"{path}, line {reader.line_num}: unreadable header ({error})") from error
    return header, text[stream.tell() :], reader.line_num + 1


def check_header(header: list[str], path: Path) -> None:
    """A header needs a ``step`` column, no ``rank`` column (the reader adds it), and no name twice."""
    if STEP not in header:
        raise RankMetricsError(f"{path}, line 1: the header has no {STEP!r} column")
    if RANK in header:
        raise RankMetricsError(f"{path}, line 1: {RANK!r} is reserved for the rank and cannot be a column")
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise RankMetricsError(f"{path}, line 1: duplicate column names {duplicates}")


def iter_records(body: str, header: list[str], path: Path, first_line: int) -> Iterator[tuple[int, list[str]]]:
    """Each data row with its line number, checked: one line, one field per name, as the writer writes them."""
    reader = csv.reader(io.StringIO(body, newline=""), strict=True)
    expected_line = first_line
    try:
        for record in reader:
            line = first_line + reader.line_num - 1
            if line != expected_line:
                raise RankMetricsError(f"{path}, line {expected_line}: a row spans lines {expected_line}-{line}")
            if len(record) != len(header):
                raise RankMetricsError(f"{path}, line {line}: expected {len(header)} fields, saw {len(record)}")
            yield line, record
            expected_line += 1
    except csv.Error as error:
        raise RankMetricsError(f"{path}, line {first_line + reader.line_num - 1}: {error}") from error


def parse_body(body: str, header: list[str], path: Path, first_line: int) -> pd.DataFrame:
    """The data rows as float64 columns named by ``header`` (pandas parses; floats come back exactly).

    The rows are checked with :func:`iter_records` first: ``pd.read_csv`` would pad a short row silently.
    """
    for _ in iter_records(body, header, path, first_line):
        pass
    try:
        return pd.read_csv(
            io.StringIO(body),
            header=None,
            names=header,
            dtype="float64",
            keep_default_na=False,
            na_values=NA_CELLS,
            skip_blank_lines=False,
            index_col=False,
        )
    except ValueError as error:
        raise _locate_bad_cell(body, header, path, first_line) or RankMetricsError(f"{path}: {error}") from error


def read_rank_file(path: Path) -> pd.DataFrame:
    """One rank's file: columns ``step`` (int64), ``epoch`` (Int64, all missing if absent), its metrics (float64).

    A last line cut short by a crash is skipped with a ``RuntimeWarning`` naming the file and line.
    """
    data = path.read_bytes()
    complete = complete_prefix_length(data)
    if complete < len(data):
        line = data.count(b"\n") + 1
        warnings.warn(f"{path}, line {line}: ignored an incomplete last line (a write cut short)", RuntimeWarning, 3)
    header, body, first_line = split_header(decode(data[:complete], path), path)
    if not header:
        return pd.DataFrame({STEP: pd.Series(dtype="int64"), EPOCH: pd.Series(dtype="Int64")})
    check_header(header, path)
    table = parse_body(body, header, path, first_line)
    whole_numbers(table[STEP], path, first_line, allow_missing=False)
    if EPOCH in table:
        whole_numbers(table[EPOCH], path, first_line, allow_missing=True)
        epoch = table.pop(EPOCH).astype("Int64")
    else:
        epoch = pd.Series(pd.NA, index=table.index, dtype="Int64")
    table.insert(0, EPOCH, epoch)
    return table.astype({STEP: "int64"})


def whole_number(cell: str | float, path: Path, line: int, column: str) -> int:
    """``cell`` as an int, or ``RankMetricsError`` naming where it is if it is not a whole number."""
    try:
        value = float(cell)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise RankMetricsError(f"{path}, line {line}, column {column!r}: expected a whole number, saw {cell!r}")
    return int(value)


def whole_numbers(cells: "pd.Series[float]", path: Path, first_line: int, *, allow_missing: bool) -> None:
    """Raise ``RankMetricsError`` at the first cell that is not a whole number (nor missing, if allowed)."""
    whole = np.isfinite(cells) & (cells == np.floor(cells))
    bad = cells.notna() & ~whole if allow_missing else ~whole
    if bad.any():
        offset = int(np.argmax(bad.to_numpy()))
        whole_number(float(cells.iloc[offset]), path, first_line + offset, str(cells.name))


def check_metric_name(name: object, step: int) -> None:
    """A metric name must be a non-empty ``str`` without NUL, encodable as UTF-8, and not ``step`` or ``rank``."""
    if not isinstance(name, str):
        raise TypeError(f"Metric names must be str, got {type(name).__name__} {name!r} at step {step}")
    if name in (STEP, RANK):
        raise ValueError(f"Metric name {name!r} is reserved (step {step}); pass the step as log_metrics(..., step=)")
    if not name or "\0" in name:
        raise ValueError(f"Metric name {name!r} at step {step} must be non-empty and contain no NUL character")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"Metric name {name!r} at step {step} cannot be written as UTF-8 ({error.reason})") from None


def check_template(filename: str) -> None:
    """A file-name template is a relative path with ``{rank}`` in it exactly once."""
    if filename.count("{rank}") != 1 or Path(filename).is_absolute():
        raise ValueError(f"filename must be a relative path with '{{rank}}' in it exactly once, got {filename!r}")


def find_rank_files(root: Path, filename: str) -> list[tuple[int, Path]]:
    """Every ``(rank, path)`` under ``root`` that matches the template, by rank (``rank_01`` is not rank 1's)."""
    prefix, suffix = filename.split("{rank}")
    pattern = re.compile(re.escape(prefix) + "(0|[1-9][0-9]*)" + re.escape(suffix))
    found = []
    for path in root.glob(_glob_escape(prefix) + "*" + _glob_escape(suffix)):
        match = pattern.fullmatch(path.relative_to(root).as_posix())
        if match is not None and path.is_file():
            found.append((int(match[1]), path))
    return sorted(found)


def _locate_bad_cell(body: str, header: list[str], path: Path, first_line: int) -> RankMetricsError | None:
    for offset, record in enumerate(csv.reader(io.StringIO(body, newline=""))):
        for name, cell in zip(header, record, strict=True):
            if cell in NA_CELLS:
                continue
            try:
                float(cell)
            except ValueError:
                return RankMetricsError(f"{path}, line {first_line + offset}, column {name!r}: not a number: {cell!r}")
    return None


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?[])", r"[\1]", text)
