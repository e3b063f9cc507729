"""The decision record's file, ``decisions.csv``: its columns, its cells, and its rows read back and checked; pure."""

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_ext._summaries.number_format import json_value
from lightning_ext.errors import DecisionRecordError

__all__ = ["COLUMNS", "FILENAME", "changed_something", "check_one_run", "decode_row", "encode_row", "json_row"]

FILENAME = "decisions.csv"
COLUMNS = (
    "run",
    "step",
    "epoch",
    "time",
    "callback",
    "monitor",
    "mode",
    "policy",
    "world_size",
    "outcome",
    "values",
    "votes",
    "yes",
    "agreed",
    "saved_as",
    "removed",
    "best_before",
    "best_after",
    "best_path_before",
    "best_path_after",
    "reason",
)
"""The record's columns, in the order a local file has them (a file merged on an object store sorts them)."""
_INTS = ("step", "epoch", "world_size")
_FLOATS = ("agreed", "best_before", "best_after")
_MISSING = "-"


def encode_row(row: Mapping[str, Any]) -> dict[str, str | int]:
    """A decision's row as the file's cells: numbers as Python writes them (``repr``: exact; ``nan``, ``inf``),
    ``values`` and ``votes`` one entry per rank, space-separated (``-``: that rank has none), nothing for ``None``.

    Example:
        >>> cells = encode_row({"values": (0.91, float("nan"), None), "votes": (True, False, None), "yes": 1})
        >>> cells["values"], cells["votes"], cells["yes"], cells["agreed"]
        ('0.91 nan -', '1 0 -', 1, '')

    """
    cells: dict[str, str | int] = {}
    for name in COLUMNS:
        value = row.get(name)
        if name == "values":
            cells[name] = " ".join(_MISSING if v is None else repr(float(v)) for v in value or ())
        elif name == "votes":
            cells[name] = " ".join(_MISSING if v is None else str(int(v)) for v in value or ())
        elif value is None:
            cells[name] = ""
        elif isinstance(value, float):
            cells[name] = repr(value)
        else:
            cells[name] = value if isinstance(value, int) else str(value)
    return cells


def _decode_values(cell: str, world_size: int, where: str, line: int) -> tuple[float | None, ...]:
    entries = cell.split(" ") if cell else []
    _check_count(entries, world_size, where, line, "values")
    try:
        return tuple(None if entry == _MISSING else float(entry) for entry in entries)
    except ValueError:
        raise DecisionRecordError(f"{where}, line {line}, column 'values': not numbers: {cell!r}") from None


def _decode_votes(cell: str, world_size: int, where: str, line: int) -> tuple[bool | None, ...]:
    entries = cell.split(" ") if cell else []
    _check_count(entries, world_size, where, line, "votes")
    known = {"1": True, "0": False, _MISSING: None}
    if any(entry not in known for entry in entries):
        raise DecisionRecordError(f"{where}, line {line}, column 'votes': expected 1, 0 or -, saw {cell!r}")
    return tuple(known[entry] for entry in entries)


def decode_row(cells: Mapping[str, str], where: str, line: int) -> dict[str, Any]:
    """One row's typed values (ints, floats with NaN for empty, per-rank tuples, text); ``DecisionRecordError`` naming
    the file, line and column where a cell is not what the writer writes.

    Example:
        >>> cells = dict.fromkeys(COLUMNS, "")
        >>> cells.update(step="4", epoch="0", world_size="2", values="0.5 nan", votes="1 0", yes="1")
        >>> row = decode_row(cells, "decisions.csv", 2)
        >>> row["values"], row["votes"], row["yes"]
        ((0.5, nan), (True, False), 1)

    """
    row: dict[str, Any] = dict(cells)
    for name in _INTS:
        row[name] = _whole(cells[name], where, line, name)
    for name in _FLOATS:
        row[name] = _number(cells[name], where, line, name)
    row["yes"] = None if cells["yes"] == "" else _whole(cells["yes"], where, line, "yes")
    row["values"] = _decode_values(cells["values"], row["world_size"], where, line)
    row["votes"] = _decode_votes(cells["votes"], row["world_size"], where, line)
    return row


def check_one_run(rows: Sequence[Mapping[str, Any]], where: str) -> None:
    """A file holds one run: each run's rows in one block, and no block going back before the one before it.

    A resumed run (a new ``run`` after the kept rows) or a second ``fit`` in one process continues the steps; two jobs
    writing one directory interleave their runs, or start again from an earlier step.
    """
    blocks: list[tuple[str, int, int, int, int]] = []  # run, first line index, last, first step, last step
    for index, row in enumerate(rows):
        if blocks and blocks[-1][0] == row["run"]:
            run, first, _, first_step, _ = blocks[-1]
            blocks[-1] = (run, first, index, first_step, row["step"])
        else:
            blocks.append((row["run"], index, index, row["step"], row["step"]))
    runs = [block[0] for block in blocks]
    again = len(set(runs)) < len(runs)
    back = any(later[3] < earlier[4] for earlier, later in itertools.pairwise(blocks))
    steps_back = any(b["step"] < a["step"] for a, b in itertools.pairwise(rows) if a["run"] == b["run"])
    if again or back or steps_back:
        listing = "; ".join(
            f"run {run}: row(s) {first + 1}-{last + 1}, steps {first_step}-{last_step}"
            for run, first, last, first_step, last_step in blocks[:6]
        )
        raise DecisionRecordError(
            f"{where} holds decisions of more than one run ({listing}{'; ...' if len(blocks) > 6 else ''}): a run's"
            " decisions come in one block, at steps that never go back. Read one run with read_decisions(...,"
            " run=...) (lightning-ext decisions --run ...), or allow_mixed=True (--allow-mixed) to read them all."
        )


def _check_count(entries: list[str], world_size: int, where: str, line: int, column: str) -> None:
    if len(entries) != world_size:
        raise DecisionRecordError(
            f"{where}, line {line}, column {column!r}: {len(entries)} entries for world size {world_size}"
        )


def _whole(cell: str, where: str, line: int, column: str) -> int:
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if not value.is_integer():
        raise DecisionRecordError(f"{where}, line {line}, column {column!r}: expected a whole number, saw {cell!r}")
    return int(value)


def _number(cell: str, where: str, line: int, column: str) -> float:
    if cell == "":
        return math.nan
    try:
        return float(cell)
    except ValueError:
        raise DecisionRecordError(f"{where}, line {line}, column {column!r}: not a number: {cell!r}") from None


def changed_something(row: dict[str, Any]) -> bool:
    """A save, a stop, an eviction, or a new best score (NaN and NaN are the same score)."""
    before, after = row["best_before"], row["best_after"]
    same_best = before == after or (math.isnan(before) and math.isnan(after))
    return row["outcome"] in ("saved", "stop") or bool(row["removed"]) or not same_best


def json_row(row: dict[str, Any]) -> dict[str, Any]:
    """Strict JSON (``summary_format.json_value``): NaN is null, infinities are the strings "inf" and "-inf"; an
    empty cell is null."""
    return {name: None if row[name] == "" else json_value(row[name]) for name in COLUMNS}
