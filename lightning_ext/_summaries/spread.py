"""The numbers behind ``rank_spread``: one value per rank, a robust z-score, a summary at any scale; pure."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

__all__ = [
    "MAD_SCALE",
    "MEAN_AD_SCALE",
    "OUTLIER",
    "OUTLIER_MARK",
    "ROBUST_Z",
    "MetricSpread",
    "RankValue",
    "Step",
    "metric_names",
    "rank_values",
    "robust_z",
    "summarize_ranks",
]

Step = int | Literal["last"]
NOT_METRICS = ("rank", "step", "epoch")
MAD_SCALE = 0.6745  # the normal distribution's MAD in standard deviations: z is on the scale of a z-score
MEAN_AD_SCALE = 0.7979  # the same for the mean absolute deviation, sqrt(2 / pi)
OUTLIER = 3.5  # |robust z| beyond which a value is an outlier (Iglewicz and Hoaglin)
# what robust_z computes, in words, and the outlier's mark: the command line prints them (its help, its table, JSON)
ROBUST_Z = (
    f"robust z = {MAD_SCALE} (value - median) / MAD, MAD the median of |value - median|; when MAD is 0,"
    f" {MEAN_AD_SCALE} (value - median) / mean(|value - median|)"
)
OUTLIER_MARK = f"* marks |z| > {OUTLIER:g}"


@dataclass(frozen=True)
class RankValue:
    """One rank's value of a metric, the step it was logged at, and its robust z-score among the ranks."""

    rank: int
    value: float
    step: int
    robust_z: float


@dataclass(frozen=True)
class MetricSpread:
    """One metric across ranks: how many have a value, their min / median / max, spread (max - min), MAD, and the
    ranks furthest from the median (largest ``|robust_z|`` first); ``scale`` says what :func:`robust_z` divided by."""

    metric: str
    ranks: int
    missing: tuple[int, ...]
    min: float
    median: float
    max: float
    spread: float
    mad: float
    scale: Literal["MAD", "mean absolute deviation", "none"]
    furthest: tuple[RankValue, ...]


def rank_values(
    table: pd.DataFrame, *, metrics: Sequence[str] | None = None, step: Step = "last"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each rank's value of each metric, and the step it comes from (NaN where a rank has none).

    Args:
        table: the long table from :func:`lightning_ext.read_rank_metrics`.
        metrics: the metrics (columns of the result), in this order; all of them (sorted by name) if ``None``.
        step: ``"last"``: each rank's last non-missing value in file order; an int: its last non-missing value
            among its rows at that step.

    Returns:
        ``(values, steps)``: float64 frames, one row per rank of ``table`` (sorted), one column per metric.

    Raises:
        ValueError: a name in ``metrics`` is not a metric of ``table``; ``step`` is neither ``"last"`` nor an int.

    """
    names = metric_names(table, metrics)
    if step != "last" and (isinstance(step, bool) or not isinstance(step, int)):
        raise ValueError(f"step must be 'last' or an int, got {step!r}")
    ranks_all = np.unique(table["rank"].to_numpy())
    rows = table if step == "last" else table[table["step"] == step]
    if not rows["rank"].is_monotonic_increasing:
        rows = rows.sort_values("rank", kind="stable")
    ranks, steps = rows["rank"].to_numpy(), rows["step"].to_numpy()
    values = pd.DataFrame(np.nan, index=pd.Index(ranks_all, name="rank"), columns=names)
    at = values.copy()
    for name in names:
        present = np.flatnonzero(~np.isnan(rows[name].to_numpy(dtype=np.float64)))
        holder = ranks[present]
        last = present[np.append(holder[1:] != holder[:-1], True)] if len(present) else present
        values.loc[ranks[last], name] = rows[name].to_numpy(dtype=np.float64)[last]
        at.loc[ranks[last], name] = steps[last]
    values.columns.name = at.columns.name = None
    return values, at


def robust_z(values: "pd.Series[float]") -> tuple["pd.Series[float]", str]:
    """Each value's robust z-score among ``values`` (NaN left out), and the scale used.

    ``z = 0.6745 (x - median) / MAD``, with MAD the median of ``|x - median|``: one wild value moves neither the
    median nor the MAD, so it cannot hide itself (a mean and standard deviation would). When more than half the
    values equal the median, MAD is 0; then ``z = 0.7979 (x - median) / mean(|x - median|)`` (the mean absolute
    deviation, scaled the same way); when that is 0 too, every finite value is the median (z = 0). Infinite values
    stay out of the scale and get ``z = ±inf``. ``|z| > OUTLIER`` marks an outlier (Iglewicz and Hoaglin).

    Example:
        >>> z, scale = robust_z(pd.Series([1.0, 1.1, 0.9, 1.0, 9.0]))
        >>> [round(value, 2) for value in z], scale
        ([0.0, 0.67, -0.67, 0.0, 53.96], 'MAD')

        One z by hand, from the formula as :data:`ROBUST_Z` states it to users: for 1, 1, 1, 5 the median is 1 and
        ``|value - median|`` is 0, 0, 0, 4, so MAD (their median) is 0 and their mean is 1; the value 5 is
        ``0.7979 (5 - 1) / 1`` away:

        >>> ROBUST_Z.endswith("when MAD is 0, 0.7979 (value - median) / mean(|value - median|)")
        True
        >>> z, scale = robust_z(pd.Series([1.0, 1.0, 1.0, 5.0]))
        >>> round(float(z[3]), 4), round(0.7979 * (5 - 1) / 1, 4), scale
        (3.1916, 3.1916, 'mean absolute deviation')

    """
    present = values.dropna()
    median = float(present.median()) if len(present) else float("nan")
    with np.errstate(invalid="ignore"):
        deviation = present - median
    finite = deviation[np.isfinite(deviation)].abs()
    mad = float(finite.median()) if len(finite) else 0.0
    mean_ad = float(finite.mean()) if len(finite) else 0.0
    scale: str
    if mad > 0:
        scale, z = "MAD", MAD_SCALE * deviation / mad
    elif mean_ad > 0:
        scale, z = "mean absolute deviation", MEAN_AD_SCALE * deviation / mean_ad
    else:
        scale, z = "none", deviation * np.inf
    z = z.where(deviation != 0, 0.0).fillna(0.0)  # x == median (inf - inf included) is 0 away
    return z.reindex(values.index), scale


def summarize_ranks(
    table: pd.DataFrame, *, metrics: Sequence[str] | None = None, step: Step = "last", top: int = 5
) -> list[MetricSpread]:
    """Per metric, a summary across ranks whose size does not grow with the number of ranks.

    Args:
        table: the long table from :func:`lightning_ext.read_rank_metrics`.
        metrics: the metrics to summarize, in this order; all of them (sorted by name) if ``None``.
        step: whose value: ``"last"`` (each rank's last value) or a step (see :func:`rank_values`).
        top: how many of the ranks furthest from the median to name (those with ``robust_z != 0`` only).

    Raises:
        ValueError: an unknown metric, a bad ``step``, or ``top < 0``.

    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ValueError(f"top must be a whole number >= 0, got {top!r}")
    values, steps = rank_values(table, metrics=metrics, step=step)
    spreads = []
    for name in values.columns:
        column = values[name]
        present = column.dropna()
        z, scale = robust_z(column)
        order = z.dropna().abs().sort_values(ascending=False, kind="stable")  # ties: the lower rank first
        furthest = tuple(
            RankValue(int(rank), float(column[rank]), int(steps.at[rank, name]), float(z[rank]))
            for rank in order.index[:top]
            if z[rank] != 0
        )
        with np.errstate(invalid="ignore"):
            low, high = (float(present.min()), float(present.max())) if len(present) else (np.nan, np.nan)
            mad = float((present - present.median()).abs().median()) if len(present) else np.nan
        spreads.append(
            MetricSpread(
                metric=str(name),
                ranks=len(present),
                missing=tuple(int(rank) for rank in column.index[column.isna()]),
                min=low,
                median=float(present.median()) if len(present) else np.nan,
                max=high,
                spread=high - low,
                mad=mad,
                scale=scale,  # type: ignore[arg-type]  # one of the three
                furthest=furthest,
            )
        )
    return spreads


def metric_names(table: pd.DataFrame, metrics: Sequence[str] | None) -> list[str]:
    """The metric columns of ``table``, sorted; or ``metrics``, checked to be among them (``ValueError``)."""
    available = sorted(str(column) for column in table.columns if column not in NOT_METRICS)
    if metrics is None:
        return available
    unknown = [name for name in metrics if name not in available]
    if unknown:
        listed = ", ".join(repr(name) for name in available) or "none"
        raise ValueError(f"Unknown metric(s) {', '.join(map(repr, unknown))}; the metrics are: {listed}")
    return list(metrics)
