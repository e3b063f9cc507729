"""The summaries' one rule for numbers in CSV and JSON: floats exact, NaN an empty CSV cell and JSON ``null``.

Infinities are ``inf`` and ``-inf`` in CSV and the strings ``"inf"`` and ``"-inf"`` in JSON (strict JSON has neither).
"""

import csv
import io
import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["csv_text", "json_value"]


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
