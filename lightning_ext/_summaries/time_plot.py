"""The ``--plot`` row of per-rank telemetry: where each batch's time goes; each rank's own time, with the verdict."""

import warnings
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from lightning_ext._files.csv_format import TELEMETRY
from lightning_ext._summaries.heatmap import draw_heatmap
from lightning_ext._summaries.stragglers import PHASES, RankTimes, rank_times, verdict

__all__ = ["draw_time_row", "is_time_column", "own_time"]

_WAITING = "waiting for the others"


def is_time_column(name: str) -> bool:
    """Whether ``name`` is one of telemetry's times (drawn in the time row, not as a metric of its own)."""
    return name.startswith(TELEMETRY) and name.endswith("_s")


def own_time(times: RankTimes, ranks: NDArray[Any]) -> NDArray[np.float64]:
    """A rank x step matrix (``ranks`` x ``times.steps``) of each rank's own time per batch: its step less its wait for
    the others (NaN: no row)."""
    matrix = np.full((len(ranks), len(times.steps)), np.nan)
    matrix[np.searchsorted(ranks, times.ranks)] = (times.step - times.wait).T
    return matrix


def draw_time_row(figure: Any, bars: Any, heatmap: Any, table: pd.DataFrame, ranks: NDArray[Any], top: int) -> None:
    """Left: the median rank's and each straggler's time per batch by phase; right: the own-time heatmap, with the
    rows where each straggler held the others back marked (the verdict of ``lightning-ext ranks --stragglers``)."""
    times = rank_times(table)
    found = verdict(times).head(top)
    parts = {**times.phases, _WAITING: times.wait}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a phase without values (files before gradient_wait_s)
        typical = {name: np.nanmedian(values, axis=0) for name, values in parts.items()}  # by rank
        median = {name: float(np.nanmedian(values)) for name, values in typical.items()}
    shown = [("median rank", median)]
    for record in found.itertuples(index=False):
        column = int(np.searchsorted(times.ranks, record.rank))
        label = f"rank {record.rank}: {record.phase}, {record.pattern}"
        shown.append((label, {name: float(values[column]) for name, values in typical.items()}))
    left = np.zeros(len(shown))
    for index, name in enumerate((*PHASES, _WAITING)):
        widths = np.nan_to_num([row[name] * 1e3 for _, row in shown])
        bars.barh(range(len(shown)), widths, left=left, color="0.8" if name == _WAITING else f"C{index}", label=name)
        left += widths
    bars.set_yticks(range(len(shown)), [label for label, _ in shown], fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel("ms per batch (median over the rank's telemetry rows)")
    bars.set_title(f"time per batch by phase: the median rank and {len(found)} straggler(s)", fontsize=10)
    bars.legend(loc="lower right", fontsize="small")
    _own_time_heatmap(figure, heatmap, times, ranks, found)


def _own_time_heatmap(figure: Any, axis: Any, times: RankTimes, ranks: NDArray[Any], found: pd.DataFrame) -> None:
    from matplotlib.colors import LogNorm

    matrix = own_time(times, ranks)
    matrix = np.where(matrix > 0, matrix, np.nan)  # no time recorded: grey, as no row
    finite = matrix[np.isfinite(matrix)]
    draw_heatmap(
        figure,
        axis,
        ranks,
        times.steps,
        matrix,
        title="each rank's own time per batch (its step less its wait for the others); cyan: a straggler's rows",
        pooled_ranks="ranks (the slowest)",
        bar_label="seconds per batch; grey: no row",
        cmap="magma_r",
        norm=LogNorm(vmin=float(finite.min()), vmax=float(finite.max())) if len(finite) else None,
    )
    for record in found.itertuples(index=False):
        for first, last in record.spans:
            axis.hlines(record.rank, first - 0.5, last + 0.5, colors="cyan", linewidth=2)
