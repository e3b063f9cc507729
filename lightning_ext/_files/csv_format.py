"""The per-rank ``metrics.csv`` format: rows encoded as stock Lightning does, and a file's bytes parsed and checked."""

import csv
import io
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from lightning_ext.errors import RankMetricsError

if TYPE_CHECKING:  # imported where a file is read back: a training run that writes files never needs pandas, whose
    import pandas as pd  # import takes seconds on every rank (docs/hang-checks.md, "Cost at scale")

__all__ = [
    "BACKWARD_S",
    "COLLECTIVES_S",
    "CUDA_ALLOCATED_BYTES",
    "CUDA_PEAK_BYTES",
    "DATA_WAIT_S",
    "EPOCH",
    "ESCAPE",
    "FORWARD_S",
    "GRADIENT_WAIT_S",
    "HOST_SUFFIX",
    "HOST_USED_BYTES",
    "NA_CELLS",
    "OPTIMIZER_S",
    "RANK",
    "RESERVED",
    "RSS_BYTES",
    "STEP",
    "STEP_S",
    "TELEMETRY",
    "TELEMETRY_COLUMNS",
    "WORKERS_RSS_BYTES",
    "check_header",
    "check_metric_name",
    "check_template",
    "column_name",
    "decode",
    "encode_rows",
    "iter_records",
    "parse_body",
    "split_header",
    "whole_number",
    "whole_numbers",
]

STEP, EPOCH, RANK = "step", "epoch", "rank"
RESERVED = (STEP, RANK)
ESCAPE = "metric:"
TELEMETRY = "telemetry/"  # per-rank telemetry's columns; a user's metric named so is escaped while it is on
STEP_S = "telemetry/step_s"
DATA_WAIT_S = "telemetry/data_wait_s"
FORWARD_S = "telemetry/forward_s"
BACKWARD_S = "telemetry/backward_s"
OPTIMIZER_S = "telemetry/optimizer_s"
COLLECTIVES_S = "telemetry/collectives_s"
GRADIENT_WAIT_S = "telemetry/gradient_wait_s"
RSS_BYTES = "telemetry/rss_bytes"
WORKERS_RSS_BYTES = "telemetry/workers_rss_bytes"
HOST_USED_BYTES = "telemetry/host_used_bytes"
CUDA_ALLOCATED_BYTES = "telemetry/cuda_allocated_bytes"
CUDA_PEAK_BYTES = "telemetry/cuda_peak_bytes"
TIME_COLUMNS = (STEP_S, DATA_WAIT_S, FORWARD_S, BACKWARD_S, OPTIMIZER_S, COLLECTIVES_S, GRADIENT_WAIT_S)
TELEMETRY_COLUMNS = (
    *TIME_COLUMNS,
    *(RSS_BYTES, WORKERS_RSS_BYTES, HOST_USED_BYTES, CUDA_ALLOCATED_BYTES, CUDA_PEAK_BYTES),
)
HOST_SUFFIX = ".host"  # beside a rank's file: its host, written when telemetry starts
NA_CELLS = ["", "nan"]  # an empty cell (metric not logged in that call) and a logged NaN both read as NaN

Cell = int | float | str


def column_name(name: str, reserved_prefix: str | None = None) -> str:
    """The column a metric is written under: its name, or ``metric:`` + a reserved name (or one starting so).

    ``reserved_prefix``: names starting with it are reserved too (``"telemetry/"`` while telemetry is on).

    Example:
        >>> [column_name(name) for name in ("loss", "rank", "step", "metric:x")]
        ['loss', 'metric:rank', 'metric:step', 'metric:metric:x']
        >>> column_name("telemetry/step_s", "telemetry/")
        'metric:telemetry/step_s'

    """
    if name in RESERVED or name.startswith(ESCAPE) or (reserved_prefix and name.startswith(reserved_prefix)):
        return ESCAPE + name
    return name


def encode_rows(fieldnames: Sequence[str], rows: Sequence[Mapping[str, Cell]], *, header: bool) -> bytes:
    """``rows`` as ``csv.DictWriter`` writes them (excel dialect, empty cells for missing names), in UTF-8.

    Every key of every row must be in ``fieldnames`` (``DictWriter`` would raise; here the writer guarantees it).

    Example:
        >>> encode_rows(["loss", "step"], [{"loss": 0.5, "step": 0}, {"step": 1}], header=True)
        b'loss,step\\r\\n0.5,0\\r\\n,1\\r\\n'

    """
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    if header:
        writer.writerow(fieldnames)
    writer.writerows([row.get(name, "") for name in fieldnames] for row in rows)
    return buffer.getvalue().encode("utf-8")


def decode(data: bytes, where: str, first_line: int = 1) -> str:
    """The text of ``data`` (lines from ``first_line`` on); ``RankMetricsError`` naming the line if it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + first_line
        raise RankMetricsError(f"{where}, line {line}: not UTF-8 text ({error.reason})") from None


def split_header(text: str, where: str) -> tuple[list[str], str, int]:
    """The header's names (``[]`` for an empty file), the text after it, and the line number where that starts.

    Example:
        >>> split_header('"a,\\nb",step\\r\\n1,0\\r\\n', "f.csv")
        (['a,\\nb', 'step'], '1,0\\r\\n', 3)

    """
    stream = io.StringIO(text, newline="")
    reader = csv.reader(stream, strict=True)
    try:
        header = next(reader, [])
    except csv.Error as error:
        raise RankMetricsError(f"{where}, line {reader.line_num}: unreadable header ({error})") from error
    return header, text[stream.tell() :], reader.line_num + 1


def check_header(header: list[str], where: str) -> None:
    """A header needs a ``step`` column, no ``rank`` column (the reader adds it), and no name twice."""
    if STEP not in header:
        raise RankMetricsError(f"{where}, line 1: the header has no {STEP!r} column")
    if RANK in header:
        raise RankMetricsError(
            f"{where}, line 1: {RANK!r} is reserved for the rank and cannot be a column (a metric named {RANK!r} is"
            f" written as {ESCAPE + RANK!r})"
        )
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise RankMetricsError(f"{where}, line 1: duplicate column names {duplicates}")


def iter_records(body: str, header: list[str], where: str, first_line: int) -> Iterator[tuple[int, list[str]]]:
    """Each data row with its line number, checked: one line, one field per name, as the writer writes them."""
    reader = csv.reader(io.StringIO(body, newline=""), strict=True)
    expected_line = first_line
    try:
        for record in reader:
            line = first_line + reader.line_num - 1
            if line != expected_line:
                raise RankMetricsError(f"{where}, line {expected_line}: a row spans lines {expected_line}-{line}")
            if len(record) != len(header):
                raise RankMetricsError(f"{where}, line {line}: expected {len(header)} fields, saw {len(record)}")
            yield line, record
            expected_line += 1
    except csv.Error as error:
        raise RankMetricsError(f"{where}, line {first_line + reader.line_num - 1}: {error}") from error


def parse_body(
    body: str,
    header: list[str],
    where: str,
    first_line: int,
    columns: Sequence[str] | None = None,
    *,
    integer: str | None = None,
) -> "pd.DataFrame":
    """The data rows as float64 columns named by ``header`` (pandas parses; floats come back exactly).

    The rows are checked with :func:`iter_records` first: ``pd.read_csv`` would pad a short row silently. Only the
    cells of ``columns`` (all if ``None``) are converted, and checked to be numbers. The column ``integer``, if given,
    is int64 where every one of its cells reads as one (else float64, for the caller to check).
    """
    import pandas as pd

    for _ in iter_records(body, header, where, first_line):
        pass
    names = header if columns is None else list(columns)
    options: dict[str, Any] = {
        "header": None,
        "names": header,
        "usecols": None if columns is None else names,
        "keep_default_na": False,
        "na_values": NA_CELLS,
        "skip_blank_lines": False,
        "index_col": False,
    }
    if integer in names:
        types = {name: "int64" if name == integer else "float64" for name in names}
        try:
            return pd.read_csv(io.StringIO(body), dtype=types, **options)
        except ValueError:
            pass  # not whole numbers: read as floats below
    try:
        return pd.read_csv(io.StringIO(body), dtype="float64", **options)
    except ValueError as error:
        bad = _locate_bad_cell(body, header, where, first_line, names)
        raise bad or RankMetricsError(f"{where}: {error}") from error


def whole_number(cell: str | float, where: str, line: int, column: str) -> int:
    """``cell`` as an int, or ``RankMetricsError`` naming where it is if it is not a whole number."""
    try:
        value = float(cell)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise RankMetricsError(f"{where}, line {line}, column {column!r}: expected a whole number, saw {cell!r}")
    return int(value)


def whole_numbers(cells: NDArray[np.float64], column: str, where: str, first_line: int, *, allow_missing: bool) -> None:
    """Raise ``RankMetricsError`` at the first cell that is not a whole number (nor missing, if allowed).

    ``cells`` are the column's values from the row on line ``first_line`` on, one row per line.
    """
    with np.errstate(invalid="ignore"):
        whole = np.isfinite(cells) & (cells == np.floor(cells))
    bad = ~(whole | np.isnan(cells)) if allow_missing else ~whole
    if bad.any():
        offset = int(np.argmax(bad))
        whole_number(float(cells[offset]), where, first_line + offset, column)


def check_metric_name(name: object, step: int) -> None:
    """A metric name must be a non-empty ``str`` without NUL and encodable as UTF-8."""
    if not isinstance(name, str):
        raise TypeError(f"Metric names must be str, got {type(name).__name__} {name!r} at step {step}")
    if not name or "\0" in name:
        raise ValueError(f"Metric name {name!r} at step {step} must be non-empty and contain no NUL character")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"Metric name {name!r} at step {step} cannot be written as UTF-8 ({error.reason})") from None


def check_template(filename: str) -> None:
    """A file-name template is a relative path with ``{rank}`` in it exactly once."""
    if filename.count("{rank}") != 1 or Path(filename).is_absolute() or "://" in filename:
        raise ValueError(f"filename must be a relative path with '{{rank}}' in it exactly once, got {filename!r}")


def _locate_bad_cell(
    body: str, header: list[str], where: str, first_line: int, columns: Sequence[str]
) -> RankMetricsError | None:
    """The first cell (by line, then column) that pandas cannot read as a number, found by bisection with pandas."""
    records = list(csv.reader(io.StringIO(body, newline="")))
    found = []
    for position, name in enumerate(header):
        if name in columns:
            cells = [record[position] for record in records]
            offset = _first_unreadable(cells)
            if offset is not None:
                found.append((offset, position, name, cells[offset]))
    if not found:
        return None
    offset, _, name, cell = min(found)
    return RankMetricsError(f"{where}, line {first_line + offset}, column {name!r}: not a number: {cell!r}")


def _first_unreadable(cells: list[str]) -> int | None:
    if _readable(cells):
        return None
    low, high = 0, len(cells)  # the first unreadable cell is in cells[low:high]
    while high - low > 1:
        middle = (low + high) // 2
        if _readable(cells[low:middle]):
            low = middle
        else:
            high = middle
    return low


def _readable(cells: list[str]) -> bool:
    """Whether pandas reads every one of ``cells`` as a float64 (or a missing value), as the reader does."""
    import pandas as pd

    text = io.StringIO()
    csv.writer(text).writerows([cell] for cell in cells)
    try:
        pd.read_csv(
            io.StringIO(text.getvalue()),
            header=None,
            dtype="float64",
            keep_default_na=False,
            na_values=NA_CELLS,
            skip_blank_lines=False,
        )
    except ValueError:
        return False
    return True
