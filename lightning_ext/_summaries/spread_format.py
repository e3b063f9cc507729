"""The summary across ranks as text, JSON records or CSV."""

from typing import Any

import pandas as pd

from lightning_ext._summaries.number_format import csv_text, json_value
from lightning_ext._summaries.spread import OUTLIER, MetricSpread, RankValue

__all__ = ["furthest_table", "spread_records", "spreads_csv", "stats_table"]

_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})
_SCALES = {"MAD": "MAD", "mean absolute deviation": "mean AD", "none": "none"}


def stats_table(spreads: list[MetricSpread]) -> str:
    """Per metric: ranks with a value, min, median, max, spread, MAD, and what the z-scores were divided by."""
    rows = [
        {
            "metric": spread.metric.translate(_ESCAPES),
            "ranks": spread.ranks,
            "min": spread.min,
            "median": spread.median,
            "max": spread.max,
            "spread": spread.spread,
            "MAD": spread.mad,
            "z scale": _SCALES[spread.scale],
        }
        for spread in spreads
    ]
    return _fixed_width(pd.DataFrame(rows))


def furthest_table(spreads: list[MetricSpread]) -> str:
    """The ranks furthest from the median, per metric, largest ``|z|`` first; ``""`` if none differs."""
    rows = [
        {
            "metric": spread.metric.translate(_ESCAPES),
            "rank": far.rank,
            "value": far.value,
            "step": far.step,
            "robust z": f"{far.robust_z:+.3g}" + (" *" if abs(far.robust_z) > OUTLIER else ""),
        }
        for spread in spreads
        for far in spread.furthest
    ]
    return _fixed_width(pd.DataFrame(rows)) if rows else ""


def spread_records(spreads: list[MetricSpread]) -> list[dict[str, Any]]:
    """One JSON-ready record per metric (see the module's note on NaN and infinities)."""
    return [
        {
            "metric": spread.metric,
            "ranks": spread.ranks,
            "missing_ranks": list(spread.missing),
            **{name: json_value(getattr(spread, name)) for name in ("min", "median", "max", "spread", "mad")},
            "z_scale": spread.scale,
            "furthest": [
                {
                    "rank": far.rank,
                    "value": json_value(far.value),
                    "step": far.step,
                    "robust_z": json_value(far.robust_z),
                }
                for far in spread.furthest
            ],
        }
        for spread in spreads
    ]


def spreads_csv(spreads: list[MetricSpread], *, top: int) -> str:
    """One CSV row per metric, with ``top`` groups of ``furthest_<i>_*`` columns (empty where there are fewer).

    Example:
        >>> spread = MetricSpread("loss", 3, (), 1.0, 1.0, 9.0, 8.0, 0.0, "mean absolute deviation",
        ...                       (RankValue(2, 9.0, 10, 2.3937),))
        >>> print(furthest_table([spread]))
        metric  rank  value  step  robust z
        loss       2      9    10     +2.39
        >>> print(spreads_csv([spread], top=1), end="")
        metric,ranks,missing_ranks,min,median,max,spread,mad,z_scale,furthest_1_rank,furthest_1_value,furthest_1_step,furthest_1_robust_z
        loss,3,,1.0,1.0,9.0,8.0,0.0,mean absolute deviation,2,9.0,10,2.3937

    """
    furthest = [f"furthest_{i}_{what}" for i in range(1, top + 1) for what in ("rank", "value", "step", "robust_z")]
    header = ["metric", "ranks", "missing_ranks", "min", "median", "max", "spread", "mad", "z_scale", *furthest]
    rows = []
    for spread in spreads:
        stats = [getattr(spread, name) for name in ("min", "median", "max", "spread", "mad")]
        cells: list[object] = [spread.metric, spread.ranks, " ".join(map(str, spread.missing)), *stats, spread.scale]
        for index in range(top):
            far: RankValue | None = spread.furthest[index] if index < len(spread.furthest) else None
            cells += [None] * 4 if far is None else [far.rank, far.value, far.step, far.robust_z]
        rows.append(cells)
    return csv_text(header, rows)


def _fixed_width(frame: pd.DataFrame) -> str:
    # names padded to one width, so that they are left-aligned under a left-aligned header
    width = max(len(name) for name in [*frame["metric"], "metric"])
    frame = frame.rename(columns={"metric": "metric".ljust(width)})
    frame[frame.columns[0]] = [name.ljust(width) for name in frame[frame.columns[0]]]
    text: str = frame.to_string(index=False, float_format="{:.6g}".format, na_rep="-")
    return text
