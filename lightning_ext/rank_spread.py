"""How far the ranks' metrics drift apart: each rank's value, a robust summary across ranks, and plots."""

from collections.abc import Sequence

import pandas as pd

from lightning_ext._summaries.host_memory import host_memory
from lightning_ext._summaries.plots import plot_rank_curves
from lightning_ext._summaries.spread import MetricSpread, RankValue, Step, rank_values, robust_z, summarize_ranks
from lightning_ext._summaries.stragglers import find_stragglers

__all__ = [
    "MetricSpread",
    "RankValue",
    "find_stragglers",
    "format_spread",
    "host_memory",
    "plot_rank_curves",
    "rank_values",
    "robust_z",
    "summarize_ranks",
    "summarize_spread",
]

# control characters in a metric name would break the fixed-width table
_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})


def summarize_spread(table: pd.DataFrame, *, metrics: Sequence[str] | None = None, step: Step = "last") -> pd.DataFrame:
    """Each metric's value on every rank side by side, and their spread across ranks (for a few ranks).

    Args:
        table: the long table from :func:`lightning_ext.read_rank_metrics`.
        metrics: the metrics to summarize, in this order; all of them (sorted by name) if ``None``.
        step: whose value: ``"last"`` (each rank's last value) or a step (see :func:`rank_values`).

    Returns:
        One row per metric (index ``metric``). Columns: ``rank <r>`` for each rank, its value (NaN if the rank has
        none); ``min``, ``max`` and ``std`` (sample standard deviation, ``ddof=1``) of those values over the ranks
        that have one; ``outlier_rank`` (nullable Int64), the rank whose value is farthest from their median (the
        lowest such rank on a tie), missing when all agree.

    Raises:
        ValueError: a name in ``metrics`` is not a metric of ``table``, or a bad ``step``.

    Example:
        >>> table = pd.DataFrame({"rank": [0, 1, 2, 3], "step": [5] * 4, "loss": [1.0, 1.0, 1.25, 0.0]})
        >>> summary = summarize_spread(table)
        >>> summary.loc["loss", ["rank 0", "rank 1", "rank 2", "rank 3", "min", "max", "std"]].tolist()
        [1.0, 1.0, 1.25, 0.0, 0.0, 1.25, 0.5543389456520863]
        >>> summary["outlier_rank"].tolist()
        [3]

    """
    last, _ = rank_values(table, metrics=metrics, step=step)
    summary = last.T.rename(columns=lambda rank: f"rank {rank}")
    summary["min"] = last.min()
    summary["max"] = last.max()
    summary["std"] = last.std()
    summary["outlier_rank"] = pd.array([_outlier(last[name]) for name in last.columns], dtype="Int64")
    summary.index.name = "metric"
    summary.columns.name = None
    return summary


def format_spread(summary: pd.DataFrame) -> str:
    """``summary`` (from :func:`summarize_spread`) as a fixed-width table: 6 significant digits, ``-`` for missing.

    Example:
        >>> table = pd.DataFrame({
        ...     "rank": [0, 0, 1, 1, 2, 2],
        ...     "step": [0, 1, 0, 1, 0, 1],
        ...     "loss": [2.0, 1.0, 2.0, 1.5, 2.0, 4.0],
        ...     "acc": [0.5, float("nan"), 0.5, 0.5, 0.5, 0.5],
        ... })
        >>> print(format_spread(summarize_spread(table)))
        metric  rank 0  rank 1  rank 2  min  max     std outlier_rank
        acc        0.5     0.5     0.5  0.5  0.5       0            -
        loss         1     1.5       4    1    4 1.60728            2
        >>> [(far.rank, far.value, round(far.robust_z, 2)) for far in summarize_ranks(table, top=1)[1].furthest]
        [(2, 4.0, 3.37)]

    """
    names = [str(name).translate(_ESCAPES) for name in summary.index]
    width = max(len(name) for name in [*names, "metric"])
    shown = summary.reset_index(drop=True)
    # names padded to one width, so that they are left-aligned under a left-aligned header
    shown.insert(0, "metric".ljust(width), [name.ljust(width) for name in names])
    # na_rep does not reach a nullable Int64 column's <NA>
    shown["outlier_rank"] = ["-" if pd.isna(rank) else str(rank) for rank in shown["outlier_rank"]]
    text: str = shown.to_string(index=False, float_format="{:.6g}".format, na_rep="-")
    return text


def _outlier(values: "pd.Series[float]") -> int | None:
    present = values.dropna()
    distance = (present - present.median()).abs().dropna()  # inf - inf is NaN: no distance
    if distance.empty or not distance.max() > 0:
        return None
    return int(distance.idxmax())
