"""The ``--plot`` row of per-rank telemetry: where each batch's time goes, and each rank's own time per batch."""

import warnings
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from lightning_ext._per_rank.csv_format import (
    BACKWARD_S,
    COLLECTIVES_S,
    DATA_WAIT_S,
    FORWARD_S,
    OPTIMIZER_S,
    STEP_S,
    TELEMETRY,
)
from lightning_ext._per_rank.stragglers import find_stragglers

__all__ = ["OWN_TIME", "draw_time_row", "is_time_column", "own_time"]

OWN_TIME = (DATA_WAIT_S, FORWARD_S, OPTIMIZER_S)  # the phases a rank does on its own, so a slow rank shows there
_BARS = (
    *((DATA_WAIT_S, "data wait"), (FORWARD_S, "forward"), (BACKWARD_S, "backward")),
    *((OPTIMIZER_S, "optimizer"), (COLLECTIVES_S, "collectives")),
)
ROWS, COLUMNS = 64, 600  # beyond, a heatmap cell holds several ranks (the slowest shows) or steps (their mean)


def is_time_column(name: str) -> bool:
    """Whether ``name`` is one of telemetry's times (drawn in the time row, not as a metric of its own)."""
    return name.startswith(TELEMETRY) and name.endswith("_s")


def own_time(table: pd.DataFrame, ranks: NDArray[Any]) -> tuple[NDArray[Any], NDArray[np.float64]]:
    """``(steps, seconds)``: a rank x step matrix of data wait + forward + optimizer per batch (NaN: no row)."""
    rows = table[table[STEP_S].notna()]
    present = [column for column in OWN_TIME if column in rows.columns]
    steps, column = np.unique(rows["step"].to_numpy(), return_inverse=True)
    matrix = np.full((len(ranks), len(steps)), np.nan)
    values = rows[present].fillna(0.0).sum(axis=1).to_numpy(dtype=np.float64)
    matrix[np.searchsorted(ranks, rows["rank"].to_numpy()), column] = values  # a step's last row wins
    return steps, matrix


def draw_time_row(figure: Any, bars: Any, heatmap: Any, table: pd.DataFrame, ranks: NDArray[Any], top: int) -> None:
    """Left: the median rank's and each straggler's time per batch by phase; right: the own-time heatmap."""
    typical = table[table[STEP_S].notna()].groupby("rank").median(numeric_only=True)
    found = find_stragglers(table)
    shown = [("median rank", typical.median())]
    for rank in dict.fromkeys(found["rank"].tolist()[:top]):
        phases = ", ".join(found.loc[found["rank"] == rank, "phase"])
        shown.append((f"rank {rank} ({phases})", typical.loc[rank]))
    left = np.zeros(len(shown))
    for index, (column, label) in enumerate(_BARS):
        if column in typical.columns:
            widths = np.array([float(row.get(column, 0.0)) * 1e3 for _, row in shown])
            bars.barh(range(len(shown)), widths, left=left, color=f"C{index}", label=label)
            left += np.nan_to_num(widths)
    steps = np.array([float(row[STEP_S]) * 1e3 for _, row in shown])
    bars.barh(range(len(shown)), np.maximum(steps - left, 0.0), left=left, color="0.8", label="other")
    bars.set_yticks(range(len(shown)), [label for label, _ in shown], fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel("ms per batch (median over the rank's telemetry rows)")
    bars.set_title(f"time per batch by phase: the median rank and {len(shown) - 1} straggler(s)", fontsize=10)
    bars.legend(loc="lower right", fontsize="small")
    _own_time_heatmap(figure, heatmap, table, ranks)


def _own_time_heatmap(figure: Any, axis: Any, table: pd.DataFrame, ranks: NDArray[Any]) -> None:
    from matplotlib.colors import LogNorm

    steps, matrix = own_time(table, ranks)
    rows, columns = -(-len(ranks) // ROWS), -(-len(steps) // COLUMNS)
    image = _pooled(matrix, rows, columns)
    finite = image[np.isfinite(image) & (image > 0)]
    norm = LogNorm(vmin=float(finite.min()), vmax=float(finite.max())) if len(finite) else None
    first, last = (float(steps[0]), float(steps[-1])) if len(steps) else (0.0, 1.0)
    shown = axis.imshow(
        np.ma.masked_invalid(np.where(image > 0, image, np.nan)),
        aspect="auto",
        interpolation="nearest",
        cmap="magma_r",
        norm=norm,
        extent=(first - 0.5, last + 0.5, float(ranks[-1]) + 0.5, float(ranks[0]) - 0.5),
    )
    held = [f"{count} {what}" for count, what in ((rows, "ranks (the slowest)"), (columns, "steps")) if count > 1]
    cell = f"; a cell: {' x '.join(held)}" if held else ""
    axis.set_title(f"each rank's own time per batch: data wait + forward + optimizer{cell}", fontsize=10)
    axis.set_xlabel("step")
    axis.set_ylabel("rank")
    figure.colorbar(shown, ax=axis).set_label("seconds per batch; grey: no row")


def _pooled(matrix: NDArray[np.float64], rows: int, columns: int) -> NDArray[np.float64]:
    """Blocks of ``rows`` ranks x ``columns`` steps: the mean over steps, then the largest over ranks."""
    if rows == 1 and columns == 1:
        return matrix
    height, width = -(-matrix.shape[0] // rows), -(-matrix.shape[1] // columns)
    padded = np.full((height * rows, width * columns), np.nan)
    padded[: matrix.shape[0], : matrix.shape[1]] = matrix
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a block without any value
        means = np.nanmean(padded.reshape(height, rows, width, columns), axis=3)
        pooled: NDArray[np.float64] = np.nanmax(means, axis=1)
    return pooled
