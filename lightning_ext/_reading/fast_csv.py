"""The rows of a per-rank file parsed fast (pyarrow, else pandas' C parser), with the exact checks kept."""

import importlib.util
import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from lightning_ext._files.csv_format import EPOCH, NA_CELLS, STEP, decode, parse_body, split_header

__all__ = [
    "BLOCK_BYTES",
    "ENGINES",
    "SplitFile",
    "default_engine",
    "parse",
    "parse_exact",
    "parse_pieces",
    "split_file",
]

ENGINES = ("pyarrow", "pandas")
BLOCK_BYTES = 1 << 18  # pyarrow parses blocks of this size in parallel, so one file keeps every core busy


class _Unusual(Exception):
    """The fast path does not apply to these bytes: take the exact path (which names any problem)."""


@dataclass(frozen=True)
class SplitFile:
    """One file's (or part's) bytes, split: its header, and where its complete data lines are."""

    where: str
    header: list[str]
    data: bytes
    start: int  # the data lines are data[start:end]: after the header, up to the last line end
    end: int
    first_line: int  # the line number of the first data line

    @property
    def body(self) -> memoryview:
        return memoryview(self.data)[self.start : self.end]


def default_engine() -> str:
    """``"pyarrow"`` where it is installed (the ``fast`` extra), else ``"pandas"``."""
    if sys.modules.get("pyarrow", True) is None:  # import blocked
        return "pandas"
    try:
        found = importlib.util.find_spec("pyarrow") is not None
    except (ImportError, ValueError):
        found = False
    return "pyarrow" if found else "pandas"


def split_file(data: bytes, where: str) -> SplitFile:
    """Split ``data`` into header and complete data lines (a last line without its line end is left out).

    Raises:
        RankMetricsError: the header is not UTF-8 or not readable as CSV.

    Example:
        >>> split = split_file(b"loss,step\\r\\n0.5,0\\r\\n,1\\r\\n", "f.csv")
        >>> split.header, split.first_line
        (['loss', 'step'], 2)
        >>> [column.tolist() for column in parse(split, ["step", "loss"], "pandas")]
        [[0, 1], [0.5, nan]]
        >>> [column.tolist() for column in parse_exact(split, ["step", "loss"])]
        [[0, 1], [0.5, nan]]

    """
    complete = data.rfind(b"\n") + 1
    end = data.find(b"\n") + 1
    line = data[:end]
    if not end or b'"' in line or line.find(b"\r") not in (-1, end - 2):
        # a header that spans lines, or is cut short: decode the whole text (rare)
        header, body, first_line = split_header(decode(data[:complete], where), where)
        encoded = body.encode("utf-8")
        return SplitFile(where, header, encoded, 0, len(encoded), first_line)
    header, _, _ = split_header(decode(line, where), where)
    return SplitFile(where, header, data, end, complete, 2)


def parse(split: SplitFile, columns: Sequence[str], engine: str) -> list[NDArray[Any]]:
    """The values of ``columns`` (``step`` first): the fast path where it applies, else :func:`parse_exact`."""
    return [
        pieces[0] if len(pieces) == 1 else np.concatenate(pieces) for pieces in parse_pieces(split, columns, engine)
    ]


def parse_pieces(split: SplitFile, columns: Sequence[str], engine: str) -> list[list[NDArray[Any]]]:
    """:func:`parse`, each column in the pieces the engine made (pyarrow: one per block; no copy to join them)."""
    if split.start == split.end:
        return [[np.empty(0, dtype=np.int64 if name == STEP else np.float64)] for name in columns]
    # no quote (the engines would take a quoted field's commas and line ends as its own; the checks refuse a quote):
    # else the row-by-row checks decide; so they do where an engine finds more rows than line feeds (it took a bare
    # carriage return for a line end)
    if split.data.find(b'"', split.start, split.end) < 0:
        try:
            return _pyarrow(split, columns) if engine == "pyarrow" else [[c] for c in _pandas(split, columns)]
        except _Unusual:
            pass
    return [[array] for array in parse_exact(split, columns)]


def parse_exact(split: SplitFile, columns: Sequence[str]) -> list[NDArray[Any]]:
    """The values of ``columns``, row by row checked (the reference; raises ``RankMetricsError``).

    ``step`` is int64 where every cell reads as one, else float64 (the caller's check then names the cell).
    """
    body = decode(bytes(split.body), split.where, split.first_line)
    table = parse_body(body, split.header, split.where, split.first_line, columns, integer=STEP)
    return [table[name].to_numpy() for name in columns]


def _types(columns: Sequence[str], integers: Sequence[str]) -> dict[str, str]:
    return {name: "int64" if name in integers else "float64" for name in columns}


def _pyarrow(split: SplitFile, columns: Sequence[str]) -> list[list[NDArray[Any]]]:
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    try:
        table = pa_csv.read_csv(
            pa.py_buffer(split.body),
            read_options=pa_csv.ReadOptions(column_names=split.header, block_size=BLOCK_BYTES),
            # no quote in these bytes (checked): the tokenizer need not look for one
            parse_options=pa_csv.ParseOptions(ignore_empty_lines=False, quote_char=False),
            convert_options=pa_csv.ConvertOptions(
                # ints where every cell is one (epoch: NaN where missing), floats for the metrics
                column_types={name: pa.type_for_alias(kind) for name, kind in _types(columns, (STEP, EPOCH)).items()},
                include_columns=list(columns),
                null_values=NA_CELLS,
                strings_can_be_null=True,
            ),
            memory_pool=pa.system_memory_pool(),  # returned to the system when freed, unlike pyarrow's own pool
        )
    except pa.ArrowException as error:
        raise _Unusual(str(error)) from error
    if table.num_rows != split.data.count(b"\n", split.start, split.end):
        # a bare carriage return, a line end to pyarrow (and an empty line is a row to it: ignore_empty_lines=False)
        raise _Unusual("more rows than line feeds")
    values = []
    for name in columns:
        column = table.column(name)
        # a view of each block's values where no cell is missing, else a copy with NaN for the missing ones
        pieces = [chunk.to_numpy(zero_copy_only=False) for chunk in column.chunks]
        nans = sum(int(np.count_nonzero(np.isnan(piece))) for piece in pieces if piece.dtype.kind == "f")
        if nans != column.null_count:
            # pyarrow reads "-nan" or "+nan" as NaN where pandas refuses them: let the exact path decide
            raise _Unusual("a NaN spelled otherwise than 'nan'")
        values.append(pieces)
    return values


def _pandas(split: SplitFile, columns: Sequence[str]) -> list[NDArray[Any]]:
    body = bytes(split.body)
    header = split.header
    try:
        # no names and no usecols: then the C parser refuses a row longer than the first (it would cut it silently)
        table = pd.read_csv(
            io.BytesIO(body),
            header=None,
            dtype={index: "int64" if name == STEP else "float64" for index, name in enumerate(header)},
            keep_default_na=False,
            na_values=NA_CELLS,
            skip_blank_lines=False,
            engine="c",
        )
    except (ValueError, pd.errors.ParserError) as error:
        raise _Unusual(str(error)) from error
    # it pads a shorter row: with no row longer than the first, as many commas as rows x (fields - 1) leave none
    # shorter; as many rows as line feeds leave no lone carriage return (a line end to the engine)
    if table.shape[1] != len(header) or len(table) != body.count(b"\n"):
        raise _Unusual("field or row counts")
    if body.count(b",") != len(table) * (len(header) - 1):
        raise _Unusual("field counts")
    return [table[header.index(name)].to_numpy() for name in columns]
