"""A ranks x steps heatmap readable at any number of ranks: cells pooled so that one odd or stopped rank still shows."""

import warnings
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["HEATMAP_COLUMNS", "HEATMAP_ROWS", "draw_heatmap", "pooled"]

HEATMAP_ROWS = 64  # beyond, a cell holds several ranks: a cell stays >= 5 px high, so one odd rank shows
HEATMAP_COLUMNS = 600


def draw_heatmap(
    figure: Any,
    axis: Any,
    ranks: NDArray[Any],
    steps: NDArray[Any],
    matrix: NDArray[np.float64],
    *,
    title: str,
    pooled_ranks: str,
    bar_label: str,
    **imshow: Any,
) -> Any:
    """Draw ``matrix`` (ranks x steps, NaN: no value, in grey) on ``axis``, pooled to at most :data:`HEATMAP_ROWS`
    x :data:`HEATMAP_COLUMNS` cells (:func:`pooled`), with its colour bar; ``pooled_ranks`` says what a cell of
    several ranks shows; ``imshow``: the colours (``cmap``, ``norm``, ``ticks`` for the bar). Returns the bar."""
    ticks = imshow.pop("ticks", None)
    rows, columns = -(-len(ranks) // HEATMAP_ROWS), -(-len(steps) // HEATMAP_COLUMNS)
    image = pooled(matrix, rows, columns) if rows > 1 or columns > 1 else matrix
    first, last = (float(steps[0]), float(steps[-1])) if len(steps) else (0.0, 1.0)
    shown = axis.imshow(
        np.ma.masked_invalid(image),
        aspect="auto",
        interpolation="nearest",
        extent=(first - 0.5, last + 0.5, float(ranks[-1]) + 0.5, float(ranks[0]) - 0.5),
        **imshow,
    )
    held = [f"{count} {what}" for count, what in ((rows, pooled_ranks), (columns, "steps")) if count > 1]
    cell = f"; a cell: {' x '.join(held)}" if held else ""
    axis.set_title(f"{title}{cell}", fontsize=10)
    axis.set_xlabel("step")
    axis.set_ylabel("rank")
    bar = figure.colorbar(shown, ax=axis, ticks=ticks)
    bar.set_label(bar_label)
    return bar


def pooled(matrix: NDArray[np.float64], rows: int, columns: int) -> NDArray[np.float64]:
    """``matrix`` in blocks of ``rows`` ranks x ``columns`` steps.

    Over steps, the mean (a rank's noise averages out, a lasting deviation stays); over ranks, the rank mean furthest
    from 0 (one odd rank in a block still shows: the largest, for times), and missing if any rank of the block has no
    value there (a rank that stopped still shows).
    """
    height, width = -(-matrix.shape[0] // rows), -(-matrix.shape[1] // columns)
    padded = np.full((height * rows, width * columns), np.nan)
    padded[: matrix.shape[0], : matrix.shape[1]] = matrix
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rank without a value in a block of steps
        means = np.nanmean(padded.reshape(height, rows, width, columns), axis=3)  # (blocks, rows, width)
    real = (np.arange(height * rows) < matrix.shape[0]).reshape(height, rows)[..., None]
    missing = (np.isnan(means) & real).any(axis=1)
    size = np.where(np.isnan(means), -1.0, np.abs(means))
    pick = np.argmax(size, axis=1)[:, None, :]
    return np.where(missing, np.nan, np.take_along_axis(means, pick, axis=1)[:, 0, :])
