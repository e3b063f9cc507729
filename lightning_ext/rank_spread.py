"""How far the ranks' metrics drift apart: a summary of each rank's last value, and per-rank curves.

Both take the long table that :func:`lightning_ext.read_rank_metrics` returns (columns ``rank``, ``step``,
``epoch``, then one column per metric). :func:`summarize_spread` computes, :func:`format_spread` prints,
:func:`plot_rank_curves` draws (it needs matplotlib, the ``plot`` extra, and imports it only when called).

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

"""

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

__all__ = ["format_spread", "plot_rank_curves", "summarize_spread"]

_NOT_METRICS = ("rank", "step", "epoch")
# control characters in a metric name would break the fixed-width table
_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})


def summarize_spread(table: pd.DataFrame, *, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Each metric's last value on every rank, and their spread across ranks.

    Args:
        table: the long table from :func:`lightning_ext.read_rank_metrics`.
        metrics: the metrics to summarize, in this order; all of them (sorted by name) if ``None``.

    Returns:
        One row per metric (index ``metric``). Columns: ``rank <r>`` for each rank, its last non-missing value in
        file order (NaN if the rank never logged the metric); ``min``, ``max`` and ``std`` (sample standard
        deviation, ``ddof=1``) of those values over the ranks that have one; ``outlier_rank`` (nullable Int64), the
        rank whose value is farthest from their median (the lowest such rank on a tie), missing when all agree.

    Raises:
        ValueError: a name in ``metrics`` is not a metric of ``table``.

    Example:
        >>> table = pd.DataFrame({"rank": [0, 1, 2, 3], "step": [5] * 4, "loss": [1.0, 1.0, 1.25, 0.0]})
        >>> summary = summarize_spread(table)
        >>> summary.loc["loss", ["rank 0", "rank 1", "rank 2", "rank 3", "min", "max", "std"]].tolist()
        [1.0, 1.0, 1.25, 0.0, 0.0, 1.25, 0.5543389456520863]
        >>> summary["outlier_rank"].tolist()
        [3]

    """
    names = _metric_names(table, metrics)
    last = table.groupby("rank", sort=True)[names].last()  # last non-missing value of each column
    summary = last.T.rename(columns=lambda rank: f"rank {rank}")
    summary["min"] = last.min()
    summary["max"] = last.max()
    summary["std"] = last.std()
    summary["outlier_rank"] = pd.array([_outlier(last[name]) for name in names], dtype="Int64")
    summary.index.name = "metric"
    summary.columns.name = None
    return summary


def format_spread(summary: pd.DataFrame) -> str:
    """``summary`` (from :func:`summarize_spread`) as a fixed-width table: 6 significant digits, ``-`` for missing."""
    names = [str(name).translate(_ESCAPES) for name in summary.index]
    width = max(len(name) for name in [*names, "metric"])
    shown = summary.reset_index(drop=True)
    # names padded to one width, so that they are left-aligned under a left-aligned header
    shown.insert(0, "metric".ljust(width), [name.ljust(width) for name in names])
    # na_rep does not reach a nullable Int64 column's <NA>
    shown["outlier_rank"] = ["-" if pd.isna(rank) else str(rank) for rank in shown["outlier_rank"]]
    text: str = shown.to_string(index=False, float_format="{:.6g}".format, na_rep="-")
    return text


def plot_rank_curves(table: pd.DataFrame, path: str | Path, *, metrics: Sequence[str] | None = None) -> None:
    """Save a figure with one subplot per metric (x: step, y: value) and one line per rank.

    Args:
        table: the long table from :func:`lightning_ext.read_rank_metrics`.
        path: the image file to write; the format follows its suffix (``.png``, ``.svg``, ``.pdf``, ...).
        metrics: the metrics to draw; all of them if ``None``.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'lightning-ext[plot]'``).
        ValueError: an unknown metric name, or no metric at all.

    """
    # the Agg canvas directly, so that pyplot's global backend and figure registry stay untouched
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = _metric_names(table, metrics)
    if not names:
        raise ValueError("There is no metric to plot")
    figure = Figure(figsize=(8.0, 1.0 + 2.5 * len(names)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    for axis, name in zip(axes, names, strict=True):
        for position, (rank, rows) in enumerate(table.groupby("rank", sort=True)):
            points = rows[["step", name]].dropna()
            if not points.empty:
                marker = "o" if len(points) == 1 else None  # a lone point draws no line
                # one colour per rank in every subplot, even where some ranks lack the metric
                color = f"C{position % 10}"
                axis.plot(points["step"], points[name], marker=marker, color=color, label=f"rank {rank}")
        axis.set_title(name.translate(_ESCAPES))
        if axis.get_lines():
            axis.legend(loc="best", fontsize="small")
    axes[-1].set_xlabel("step")
    figure.savefig(path)


def _metric_names(table: pd.DataFrame, metrics: Sequence[str] | None) -> list[str]:
    available = sorted(str(column) for column in table.columns if column not in _NOT_METRICS)
    if metrics is None:
        return available
    unknown = [name for name in metrics if name not in available]
    if unknown:
        listed = ", ".join(repr(name) for name in available) or "none"
        raise ValueError(f"Unknown metric(s) {', '.join(map(repr, unknown))}; the metrics are: {listed}")
    return list(metrics)


def _outlier(values: "pd.Series[float]") -> int | None:
    present = values.dropna()
    distance = (present - present.median()).abs().dropna()  # inf - inf is NaN: no distance
    if distance.empty or not distance.max() > 0:
        return None
    return int(distance.idxmax())
