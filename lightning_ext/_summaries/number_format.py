"""The summaries' numbers: in CSV and JSON one rule, floats exact, NaN an empty CSV cell and JSON ``null`` (infinities
``inf``/``-inf`` in CSV, the strings ``"inf"``/``"-inf"`` in JSON: strict JSON has neither); for people, in units with 3
significant digits (rank 0's live straggler warning uses these too: this module imports no pandas).
"""

import csv
import io
import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["csv_text", "duration", "json_value", "size", "step_ranges"]


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """``header`` and ``rows`` as CSV text: a float as ``repr`` (it reads back exactly), NaN and ``None`` empty.

    Example:
        >>> print(csv_text(["a", "b", "c"], [[1, 0.1, float("nan")], ["x", float("-inf"), None]]), end="")
        a,b,c
        1,0.1,
        x,-inf,

    """
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([_cell(value) for value in row] for row in rows)
    return text.getvalue()


def json_value(value: Any) -> Any:
    """``value`` for strict JSON: NaN is ``None``, infinities ``"inf"``/``"-inf"``; tuples and lists item by item.

    Example:
        >>> json_value((1.5, float("nan"), float("-inf"), "x"))
        [1.5, None, '-inf', 'x']

    """
    if isinstance(value, (tuple, list)):
        return [json_value(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(float(value))
    return value


def duration(seconds: float) -> str:
    """``seconds`` in s, ms or µs, 3 significant digits.

    Example:
        >>> print(duration(0.0423), duration(2.5e-5), size(3 * 2**30))
        42.3 ms 25 µs 3 GiB

    """
    if math.isnan(seconds):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-6:.3g} µs"


def size(count: float) -> str:
    """``count`` bytes in GiB, MiB, KiB or B, 3 significant digits."""
    if math.isnan(count):
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


def step_ranges(spans: tuple[tuple[int, int], ...], *, shown: int | None = None) -> str:
    """The steps of runs of telemetry rows, as ``"40-42, 97"`` (``shown``: at most that many runs, then how many more).

    Example:
        >>> step_ranges(((40, 42), (97, 97), (120, 150)), shown=2)
        '40-42, 97 and 1 more'
    """
    parts = [f"{first}" if first == last else f"{first}-{last}" for first, last in spans]
    if shown is not None and len(parts) > shown:
        return ", ".join(parts[:shown]) + f" and {len(parts) - shown} more"
    return ", ".join(parts)
