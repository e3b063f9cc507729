"""The rows of per-rank files parsed fast (pyarrow's CSV reader, else pandas' C parser), with the exact checks kept.

A per-rank file's data rows hold numbers only, one row per line. The fast path checks that in one pass over the bytes
(:func:`_scan`: only the characters of numbers, commas and line ends), lets the engine count the fields of every row
(pyarrow does; for pandas, :func:`_fields_agree` counts them) and convert the cells to float64, and compares the rows
it found with the lines counted (a lone carriage return, which both engines take for a line end, changes that).
Anything unusual (a quote, a cell that is not a number, a NaN spelled otherwise than ``nan``; and, found by the
caller's checks of ``step``, a blank line, which the engines read as a row of missing cells) sends the file down
the exact path instead: the row-by-row checks of :mod:`lightning_ext._metrics_csv`,
which name the file, line and column of a problem. So both engines return the same arrays and raise the same errors;
only the time differs. Only the columns asked for are converted, and only their cells are checked to be numbers.

Files with the same header are parsed in one engine call (:func:`parse_batch`), which lets pyarrow use every core.

Example:
    >>> layout = split_file(b"loss,step\\r\\n0.5,0\\r\\n,1\\r\\n", "f.csv")
    >>> layout.header, layout.rows, layout.first_line
    (['loss', 'step'], 2, 2)
    >>> [column.tolist() for column in parse_exact(layout, ["loss", "step"])]
    [[0.5, nan], [0.0, 1.0]]

"""

import importlib.util
import io
import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from lightning_ext._metrics_csv import NA_CELLS, decode, parse_body, split_header

__all__ = ["ENGINES", "Layout", "Unusual", "default_engine", "parse_batch", "parse_exact", "parse_one", "split_file"]

ENGINES = ("pyarrow", "pandas")
Column = NDArray[np.float64]

# every character a row of numbers needs, as the writer writes them (repr of floats: 1e-05, inf, nan)
_NUMBER_BYTES = b"0123456789+-.eE,nanif\r"  # and line feeds, counted apart


class Unusual(Exception):
    """The fast path does not apply to these bytes: take the exact path (which names any problem)."""


@dataclass
class Layout:
    """One file's (or part's) bytes, split: its header, its complete data lines, and where they start."""

    where: str
    header: list[str]
    body: memoryview  # the complete data lines, after the header
    first_line: int  # the line number of the first data line
    rows: int  # data lines in ``body``
    plain: bool  # numbers, commas and line ends only, no blank line: the fast path applies


def default_engine() -> str:
    """``"pyarrow"`` where it is installed (the ``fast`` extra), else ``"pandas"``."""
    if sys.modules.get("pyarrow", True) is None:  # import blocked
        return "pandas"
    try:
        found = importlib.util.find_spec("pyarrow") is not None
    except (ImportError, ValueError):
        found = False
    return "pyarrow" if found else "pandas"


def split_file(data: bytes, where: str) -> Layout:
    """Split ``data`` into header and complete data lines (a last line without its line end is left out).

    Raises:
        RankMetricsError: the header is not UTF-8 or not readable as CSV.

    """
    complete = data.rfind(b"\n") + 1
    end = data.find(b"\n") + 1
    line = data[:end]
    if not end or b'"' in line or line.find(b"\r") not in (-1, end - 2):
        # a header that spans lines, or is cut short: decode the whole text (rare)
        header, body, first_line = split_header(decode(data[:complete], where), where)
        encoded = body.encode("utf-8")
        return Layout(where, header, memoryview(encoded), first_line, *_scan(encoded, 0, len(encoded)))
    header, _, _ = split_header(decode(line, where), where)
    return Layout(where, header, memoryview(data)[end:complete], 2, *_scan(data, end, complete))


def parse_exact(layout: Layout, columns: Sequence[str]) -> list[Column]:
    """The float64 values of ``columns``, row by row checked (the reference; raises ``RankMetricsError``)."""
    body = decode(bytes(layout.body), layout.where, layout.first_line)
    table = parse_body(body, layout.header, layout.where, layout.first_line, columns)
    return [table[name].to_numpy(dtype=np.float64) for name in columns]


def parse_batch(layouts: Sequence[Layout], columns: Sequence[str], engine: str) -> list[list[Column]]:
    """The float64 values of ``columns`` in each of ``layouts`` (which share one header), parsed in one call.

    Raises:
        Unusual: something in the bytes needs the exact path; parse each layout with :func:`parse_one` instead.

    """
    header = layouts[0].header
    for layout in layouts:
        if not layout.plain:
            raise Unusual(layout.where)
    body = b"".join(layout.body for layout in layouts) if len(layouts) > 1 else bytes(layouts[0].body)
    if engine == "pyarrow":
        values = _pyarrow(body, header, columns)
    else:
        if not _fields_agree(body, len(header)):
            raise Unusual("field counts")
        values = _pandas(body, header, columns)
    rows = [layout.rows for layout in layouts]
    if any(len(column) != sum(rows) for column in values):
        raise Unusual("row count")
    bounds = np.cumsum([0, *rows])
    return [[column[start:stop] for column in values] for start, stop in itertools.pairwise(bounds)]


def parse_one(layout: Layout, columns: Sequence[str], engine: str) -> list[Column]:
    """One layout's values: the fast path if it applies, else the exact path."""
    if layout.rows == 0:
        return [np.empty(0) for _ in columns]
    try:
        return parse_batch([layout], columns, engine)[0]
    except Unusual:
        return parse_exact(layout, columns)


def _scan(data: bytes, start: int, end: int) -> tuple[int, bool]:
    """The lines of ``data[start:end]``, and whether it holds only the characters of numbers, commas and line ends.

    One pass, without copying the body: ``translate`` deletes those characters except the line feed, from the whole of
    ``data``, and the little that is left over is counted, less what the bytes outside the body leave over.
    """
    lines = other = 0
    for part, sign in ((data, 1), (data[:start], -1), (data[end:], -1)):
        left = part.translate(None, _NUMBER_BYTES)
        feeds = left.count(b"\n")
        lines += sign * feeds
        other += sign * (len(left) - feeds)
    return lines, other == 0


def _pyarrow(body: bytes, header: list[str], columns: Sequence[str]) -> list[Column]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pa_csv

    try:
        table = pa_csv.read_csv(
            pa.py_buffer(body),
            read_options=pa_csv.ReadOptions(column_names=header),
            parse_options=pa_csv.ParseOptions(ignore_empty_lines=False),
            convert_options=pa_csv.ConvertOptions(
                column_types=dict.fromkeys(columns, pa.float64()),
                include_columns=list(columns),
                null_values=NA_CELLS,
                strings_can_be_null=True,
            ),
            memory_pool=pa.system_memory_pool(),
        )
    except pa.ArrowException as error:
        raise Unusual(str(error)) from error
    values = []
    for name in columns:
        column = table.column(name)
        # pyarrow reads "-nan" or "+nan" as NaN where pandas refuses them: let the exact path decide
        if pc.any(pc.is_nan(column)).as_py():
            raise Unusual("a NaN spelled otherwise than 'nan'")
        values.append(column.to_numpy())
    return values


def _pandas(body: bytes, header: list[str], columns: Sequence[str]) -> list[Column]:
    try:
        table = pd.read_csv(
            io.BytesIO(body),
            header=None,
            names=header,
            usecols=list(columns),
            dtype="float64",
            keep_default_na=False,
            na_values=NA_CELLS,
            skip_blank_lines=False,
            index_col=False,
            engine="c",
        )
    except (ValueError, pd.errors.ParserError) as error:
        raise Unusual(str(error)) from error
    return [table[name].to_numpy(dtype=np.float64) for name in columns]


def _fields_agree(body: bytes, fields: int) -> bool:
    """Every line has ``fields`` fields (pandas' C parser pads a short row silently)."""
    if fields == 1:
        return b"," not in body
    array = np.frombuffer(body, dtype=np.uint8)
    line_ends = np.flatnonzero(array == ord("\n"))
    commas = np.flatnonzero(array == ord(","))
    per_line = np.diff(np.searchsorted(commas, line_ends), prepend=0)
    return bool(np.all(per_line == fields - 1))
