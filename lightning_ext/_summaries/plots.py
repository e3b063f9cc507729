"""Per-rank plots readable at any number of ranks: curves or percentile bands, and a ranks x steps heatmap."""

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from lightning_ext._files.csv_format import STEP_S
from lightning_ext._summaries.heatmap import draw_heatmap
from lightning_ext._summaries.spread import MAD_SCALE, MEAN_AD_SCALE, OUTLIER, metric_names
from lightning_ext._summaries.time_plot import draw_time_row, is_time_column

__all__ = [
    "BANDS",
    "CURVE_POINTS",
    "LINES",
    "draw",
    "furthest_over_the_run",
    "plot_rank_curves",
    "rank_step_matrix",
    "step_z",
]

LINES = 8  # ranks drawn one line each; more get percentile bands
CURVE_POINTS = 500  # points per curve, at most (runs of steps are averaged)
BANDS = (2.0, OUTLIER, 5.0, 10.0, 20.0)  # edges of the colours, in |robust z|; the last also caps |z|
_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})


def plot_rank_curves(
    table: pd.DataFrame, path: str | Path, *, metrics: Sequence[str] | None = None, top: int = 5
) -> None:
    """Save a figure with, per metric, the per-rank curves (or percentile bands) and a ranks x steps heatmap.

    Args:
        table: the long table from :func:`lightning_ext.read_rank_metrics`.
        path: the image file to write; the format follows its suffix (``.png``, ``.svg``, ``.pdf``, ...).
        metrics: the metrics to draw; all of them if ``None``.
        top: beyond :data:`LINES` ranks, how many of the ranks furthest from the others to draw as lines.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'lightning-ext[plot]'``).
        ValueError: an unknown metric, or no metric at all.

    """
    draw(table, metrics=metrics, top=top).savefig(path, dpi=100)


def draw(table: pd.DataFrame, *, metrics: Sequence[str] | None = None, top: int = 5) -> Any:
    """The figure :func:`plot_rank_curves` saves (a ``matplotlib.figure.Figure`` on the Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = metric_names(table, metrics)
    timing = metrics is None and STEP_S in table.columns and table[STEP_S].notna().any()
    if metrics is None:  # telemetry's times get a row of their own
        names = [name for name in names if not is_time_column(name)]
    if not names and not timing:
        raise ValueError("There is no metric to plot")
    ranks = np.unique(table["rank"].to_numpy())
    figure = Figure(figsize=(14.0, 0.6 + 3.6 * (len(names) + timing)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(names) + timing, 2, squeeze=False, width_ratios=[1.1, 1.0])
    if timing:
        draw_time_row(figure, axes[-1][0], axes[-1][1], table, ranks, top)
    for (curves, heatmap), name in zip(axes, names, strict=False):
        _, steps, matrix = rank_step_matrix(table, name, ranks)
        z = step_z(matrix)
        title = name.translate(_ESCAPES)
        width = -(-len(steps) // CURVE_POINTS)  # steps averaged per point drawn
        if len(ranks) <= LINES:
            _lines(curves, ranks, steps, matrix, width)
            what = "each rank"
        else:
            furthest = furthest_over_the_run(z, top)
            _bands(curves, steps, matrix, [(int(ranks[row]), score) for row, score in furthest], ranks, width)
            what = f"{len(ranks)} ranks, {len(furthest)} with mean |z| >= {BANDS[0]:g}"
        curves.set_title(f"{title}: {what}" + (f" (means of {width} steps)" if width > 1 else ""), fontsize=10)
        curves.set_xlabel("step")
        curves.grid(alpha=0.3)
        _heatmap(figure, heatmap, ranks, steps, z, title)
    figure.suptitle(f"Per-rank metrics: {len(ranks)} rank(s), {len(table)} row(s)")
    return figure


def furthest_over_the_run(z: NDArray[np.float64], top: int) -> list[tuple[int, float]]:
    """``(row, mean |z|)`` of the rows of ``z`` furthest from the others over their steps, largest first.

    A row's score is the mean of its ``|z|`` capped at ``BANDS[-1]`` (missing values left out); rows scoring under
    ``BANDS[0]`` are within the usual spread and left out; at most ``top`` rows (ties: the lower row first).
    """
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rank without any value
        scores = np.nanmean(np.minimum(np.abs(z), BANDS[-1]), axis=1)
    order = np.argsort(-np.nan_to_num(scores, nan=-1.0), kind="stable")
    return [(int(row), float(scores[row])) for row in order[:top] if scores[row] >= BANDS[0]]


def rank_step_matrix(
    table: pd.DataFrame, name: str, ranks: NDArray[Any]
) -> tuple[NDArray[Any], NDArray[Any], NDArray[np.float64]]:
    """``(ranks, steps, values)``: a rank x step matrix of ``name`` (the last value where a step has several)."""
    rows = table[["rank", "step", name]].dropna(subset=[name])
    steps, column = np.unique(rows["step"].to_numpy(), return_inverse=True)
    row = np.searchsorted(ranks, rows["rank"].to_numpy())
    matrix = np.full((len(ranks), len(steps)), np.nan)
    key = row * len(steps) + column
    _, last = np.unique(key[::-1], return_index=True)  # the last row for each (rank, step)
    keep = len(key) - 1 - last
    matrix[row[keep], column[keep]] = rows[name].to_numpy(dtype=np.float64)[keep]
    return ranks, steps, matrix


def _binned(steps: NDArray[Any], values: NDArray[np.float64], width: int) -> tuple[NDArray[Any], NDArray[Any]]:
    """``steps`` and each row of ``values`` averaged over runs of ``width`` steps (NaN left out)."""
    if width <= 1:
        return steps, values
    count = -(-len(steps) // width)
    padded = np.full((values.shape[0], count * width), np.nan)
    padded[:, : values.shape[1]] = values
    spots = np.full(count * width, np.nan)
    spots[: len(steps)] = steps
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a run of steps without a value
        return np.nanmean(spots.reshape(count, width), axis=1), np.nanmean(padded.reshape(-1, count, width), axis=2)


def _lines(axis: Any, ranks: NDArray[Any], steps: NDArray[Any], matrix: NDArray[np.float64], width: int) -> None:
    x, lines = _binned(steps, matrix, width)
    for position, rank in enumerate(ranks):
        present = ~np.isnan(lines[position])
        if present.any():
            marker = "o" if present.sum() == 1 else None  # a lone point draws no line
            # one colour per rank in every subplot, even where some ranks lack the metric
            color = f"C{position % 10}"
            axis.plot(x[present], lines[position, present], marker=marker, color=color, label=f"rank {rank}")
    if axis.get_lines():
        axis.legend(loc="best", fontsize="small")


def _bands(
    axis: Any,
    steps: NDArray[Any],
    matrix: NDArray[np.float64],
    outliers: list[tuple[int, float]],
    ranks: NDArray[Any],
    width: int,
) -> None:
    x, bands = _binned(steps, _percentiles(matrix, [5, 25, 50, 75, 95]), width)
    low, quarter, median, three_quarters, high = bands
    shown = ~np.isnan(median)
    x = x[shown]
    axis.fill_between(x, low[shown], high[shown], color="tab:blue", alpha=0.18, lw=0, label="5-95th percentile")
    axis.fill_between(x, quarter[shown], three_quarters[shown], color="tab:blue", alpha=0.35, lw=0, label="25-75th")
    axis.plot(x, median[shown], color="black", linewidth=1.2, label="median")
    rows = np.searchsorted(ranks, [rank for rank, _ in outliers])
    x, lines = _binned(steps, matrix[rows], width)
    for index, (rank, score) in enumerate(outliers):
        present = ~np.isnan(lines[index])
        label = f"rank {rank} (mean |z| {score:.3g})"
        axis.plot(x[present], lines[index, present], color=f"C{(index + 1) % 10}", linewidth=1.0, label=label)
    axis.legend(loc="best", fontsize="small")


def _percentiles(matrix: NDArray[np.float64], quantiles: list[float]) -> NDArray[np.float64]:
    if not np.isnan(matrix).any():
        return np.percentile(matrix, quantiles, axis=0)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-missing step: NaN, not drawn
        return np.nanpercentile(matrix, quantiles, axis=0)


def step_z(matrix: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each value's robust z-score among the ranks at its step (a column), as :func:`robust_z` defines it."""
    with np.errstate(all="ignore"):
        median = _percentiles(matrix, [50])[0]
        deviation = matrix - median
        absolute = np.abs(deviation)
        finite = np.where(np.isfinite(absolute), absolute, np.nan)
        mad = _percentiles(finite, [50])[0]
        mean_ad = np.nanmean(finite, axis=0) if np.isnan(finite).any() else finite.mean(axis=0)
        scale = np.where(mad > 0, mad / MAD_SCALE, np.where(mean_ad > 0, mean_ad / MEAN_AD_SCALE, np.inf))
        z = deviation / scale
        z = np.where(np.isinf(scale) & (deviation != 0) & ~np.isnan(deviation), np.sign(deviation) * np.inf, z)
        return np.where(deviation == 0, 0.0, z)


def _heatmap(
    figure: Any, axis: Any, ranks: NDArray[Any], steps: NDArray[Any], z: NDArray[np.float64], title: str
) -> None:
    from matplotlib import colormaps
    from matplotlib.colors import BoundaryNorm, ListedColormap

    # one colour per band of |z|: white within the usual spread, darker the further out
    edges = [-value for value in BANDS[::-1]] + list(BANDS)
    shades = colormaps["RdBu_r"](np.linspace(0.0, 1.0, len(edges) - 1))
    shades[len(shades) // 2] = (1.0, 1.0, 1.0, 1.0)
    colours = ListedColormap(shades).with_extremes(bad="0.55")
    draw_heatmap(
        figure,
        axis,
        ranks,
        steps,
        np.clip(z, -BANDS[-1], BANDS[-1]),
        title=f"{title}: robust z of each rank at each step",
        pooled_ranks="ranks",
        bar_label="robust z at the step; grey: no value",
        cmap=colours,
        norm=BoundaryNorm(edges, colours.N),
        ticks=edges[1:-1],
    )
