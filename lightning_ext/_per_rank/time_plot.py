"""The ``--plot`` row of per-rank telemetry: where each batch's time goes, and each rank's own time per batch."""

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
from lightning_ext._per_rank.heatmap import draw_heatmap
from lightning_ext._per_rank.stragglers import find_stragglers

__all__ = ["OWN_TIME", "draw_time_row", "is_time_column", "own_time"]

OWN_TIME = (DATA_WAIT_S, FORWARD_S, OPTIMIZER_S)  # the phases a rank does on its own, so a slow rank shows there
_BARS = (
    *((DATA_WAIT_S, "data wait"), (FORWARD_S, "forward"), (BACKWARD_S, "backward")),
    *((OPTIMIZER_S, "optimizer"), (COLLECTIVES_S, "collectives")),
)


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
    matrix = np.where(matrix > 0, matrix, np.nan)  # no time recorded: grey, as no row
    finite = matrix[np.isfinite(matrix)]
    draw_heatmap(
        figure,
        axis,
        ranks,
        steps,
        matrix,
        title="each rank's own time per batch: data wait + forward + optimizer",
        pooled_ranks="ranks (the slowest)",
        bar_label="seconds per batch; grey: no row",
        cmap="magma_r",
        norm=LogNorm(vmin=float(finite.min()), vmax=float(finite.max())) if len(finite) else None,
    )
