"""The straggler verdict: the rank the others wait for, its phase, chronic or in bursts, what it costs them; pure.

A rank's time per batch is its **wait** for the others (blocked in a collective: ``collectives_s``, ``gradient_wait_s``)
and its **own time** (the rest, by phase). The rule is :func:`stragglers`' (``docs/per-rank-metrics.md`` states it);
rank 0's live check runs it without pandas (``docs/internals.md``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.typing import NDArray

from lightning_ext._files.csv_format import (
    BACKWARD_S,
    COLLECTIVES_S,
    DATA_WAIT_S,
    FORWARD_S,
    GRADIENT_WAIT_S,
    OPTIMIZER_S,
    STEP_S,
    TIME_COLUMNS,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CHRONIC",
    "MIN_HELD",
    "MIN_SHARE",
    "PHASES",
    "TIMES",
    "RankTimes",
    "Straggler",
    "find_stragglers",
    "phase_medians",
    "rank_times",
    "stragglers",
    "verdict",
    "window_times",
]

MIN_SHARE = 0.05  # what the others lose waiting for a straggler, at least, as a share of the step
CHRONIC = 0.5  # a straggler that holds the others back in more than this share of its rows is chronic
MIN_HELD = 2  # rows in which a straggler held the others back, at least: one row alone is a one-off (a hiccup)
TIMES = TIME_COLUMNS  # what it reads: each batch's time by phase
# the phases of a rank's own time; "hooks and logging" is the rest of it: the batch hooks and callbacks, the logging,
# the batch's transfer to the device, Lightning's own work
PHASES = ("data loading", "forward", "backward compute", "optimizer", "hooks and logging")
_PHASE_COLUMNS = {"data loading": DATA_WAIT_S, "forward": FORWARD_S, "backward compute": BACKWARD_S,
                  "optimizer": OPTIMIZER_S}  # fmt: skip
COLUMNS = ["rank", "phase", "pattern", "cost", "waited_s", "excess_s", "seconds", "others_s", "held", "rows", "spans"]
Matrix = NDArray[np.float64]
Spans = tuple[tuple[int, int], ...]  # (first step, last step) of each run of rows


@dataclass(frozen=True)
class RankTimes:
    """Every rank's telemetry rows side by side: a steps x ranks matrix per quantity (NaN: no row there).

    Attributes:
        ranks: the ranks, ascending (the columns).
        steps: the rows' steps, ascending (the rows).
        step: seconds per batch.
        wait: seconds per batch blocked in collectives (``collectives_s + gradient_wait_s``).
        phases: the own time's parts, by phase (:data:`PHASES`); ``backward compute`` is NaN where the files predate
            ``gradient_wait_s`` (their ``backward_s`` held the wait, so it counts as waiting there).

    """

    ranks: NDArray[np.int64]
    steps: NDArray[np.int64]
    step: Matrix
    wait: Matrix
    phases: dict[str, Matrix]


def rank_times(table: pd.DataFrame, *, warm_up: bool = True) -> RankTimes:
    """The telemetry rows of ``table`` (the long table of ``read_rank_metrics``) as :class:`RankTimes`.

    ``warm_up``: leave out each rank's first telemetry row (the first batches of a fit: lazy set-up, DDP's buckets).

    Raises:
        ValueError: the table has no telemetry.

    """
    if STEP_S not in table.columns:
        raise ValueError(
            f"The table has no {STEP_S!r} column: the per-rank files hold no telemetry"
            " (turn it on with PerRankMetrics(telemetry=True))"
        )
    rows = table.loc[table[STEP_S].notna(), ["rank", "step", *(name for name in TIMES if name in table.columns)]]
    rows = rows.drop_duplicates(["rank", "step"], keep="last")  # a resumed run's step: its latest row
    if warm_up:
        rows = rows[rows.groupby("rank").cumcount() > 0]
    columns = {name: rows[name].to_numpy(dtype=np.float64) for name in TIMES if name in rows.columns}
    return _times(rows["rank"].to_numpy(dtype=np.int64), rows["step"].to_numpy(dtype=np.int64), columns)


def window_times(windows: Mapping[int, Sequence[tuple[int, Mapping[str, float]]]]) -> RankTimes:
    """Each rank's latest telemetry rows (``rank -> [(step, {column: seconds})]``, rank 0's live check) as
    :class:`RankTimes`, every row kept (a rank's later row for a step replaces an earlier one).

    Example:
        >>> times = window_times({0: [(3, {"telemetry/step_s": 0.05})], 1: [(3, {"telemetry/step_s": 0.07})]})
        >>> times.ranks.tolist(), times.steps.tolist(), times.step.tolist()
        ([0, 1], [3], [[0.05, 0.07]])

    """
    latest = {(rank, step): values for rank, rows in windows.items() for step, values in rows}
    latest = {key: values for key, values in latest.items() if not np.isnan(values.get(STEP_S, np.nan))}
    names = [name for name in TIMES if any(name in values for values in latest.values())]
    rows = list(latest.values())
    columns = {name: np.array([values.get(name, np.nan) for values in rows], dtype=np.float64) for name in names}
    ranks = np.array([rank for rank, _ in latest], dtype=np.int64)
    return _times(ranks, np.array([step for _, step in latest], dtype=np.int64), columns)


def _times(rank: NDArray[np.int64], step_of: NDArray[np.int64], columns: dict[str, NDArray[np.float64]]) -> RankTimes:
    """The matrices of rows given as columns: each row's rank, its step, and its seconds by column."""
    ranks = np.unique(rank)
    steps, row_of = np.unique(step_of, return_inverse=True)
    column_of = np.searchsorted(ranks, rank)

    def matrix(name: str) -> Matrix:  # a column the files lack (no collective was timed) counts as 0
        values = np.full((len(steps), len(ranks)), np.nan)
        values[row_of, column_of] = columns.get(name, 0.0)
        return values

    step = matrix(STEP_S)
    if GRADIENT_WAIT_S in columns:
        wait, backward = matrix(COLLECTIVES_S) + matrix(GRADIENT_WAIT_S), matrix(BACKWARD_S)
    else:  # written before the wait was measured: backward held the gradient all-reduce's wait
        wait, backward = matrix(COLLECTIVES_S) + matrix(BACKWARD_S), np.full_like(step, np.nan)
    phases = {name: matrix(column) for name, column in _PHASE_COLUMNS.items()}
    phases["backward compute"] = backward
    phases["hooks and logging"] = step - wait - np.nansum(np.stack(list(phases.values())), axis=0)
    return RankTimes(ranks, steps, step, wait, phases)


class Straggler(NamedTuple):
    """One straggler of :func:`stragglers` (its fields are :data:`COLUMNS`, described there)."""

    rank: int
    phase: str
    pattern: str
    cost: float
    waited_s: float
    excess_s: float
    seconds: float
    others_s: float
    held: int
    rows: int
    spans: Spans


def verdict(times: RankTimes, *, min_share: float = MIN_SHARE) -> pd.DataFrame:
    """:func:`stragglers` as a table, a row each (:data:`COLUMNS`)."""
    import pandas as pd

    return pd.DataFrame(stragglers(times, min_share=min_share), columns=COLUMNS)


def stragglers(times: RankTimes, *, min_share: float = MIN_SHARE) -> list[Straggler]:
    """The stragglers among ``times``'s ranks.

    In a row, a rank *holds the others back* when the other ranks' median wait exceeds its own by at least
    ``min_share`` of the step (the ranks' median) and its own time exceeds theirs by as much. What they *lose* there
    is the smaller of the two excesses; its *cost* is that, summed over the rows, as a share of the run's step time.
    It is a straggler when its cost exceeds the other ranks' median cost by at least ``min_share``, in at least
    :data:`MIN_HELD` rows (one row alone is a one-off): *chronic* when it
    held them back in more than :data:`CHRONIC` of its rows, *in bursts* otherwise. Its phase is the one where, in
    those rows, its own time exceeds the others' median the most.

    Returns:
        One per straggler, the costliest first: ``rank``; ``phase`` (where its extra time goes); ``pattern``
        (``"chronic"`` or ``"bursts"``); ``cost`` (the others' extra wait in the rows where it held them back, as a
        share of their step time over the run); ``waited_s`` (their extra wait per batch in those rows, mean);
        ``excess_s``, ``seconds``, ``others_s`` (its extra time per batch in the phase, its time and the others'
        median time there, means over those rows); ``held`` (those rows) of ``rows`` (its rows with another rank's
        beside them); ``spans`` (those rows' steps, as ``(first, last)`` of each run of consecutive rows).

    """
    step, wait = times.step, times.wait
    own = step - wait
    reference = _row_median(step)
    waited = _median_of_others(wait) - wait  # how much longer the others waited than this rank
    lag = own - _median_of_others(own)  # how much longer this rank worked than the others
    compared = ~np.isnan(waited) & ~np.isnan(lag)
    floor = min_share * reference
    held = compared & (waited >= floor) & (lag >= floor)
    spent = np.where(compared, np.broadcast_to(reference, step.shape), 0.0).sum(axis=0)
    lost = np.where(held, np.minimum(waited, lag), 0.0)  # the two measures of one wait: the smaller, to be sure
    with np.errstate(invalid="ignore", divide="ignore"):
        cost = lost.sum(axis=0) / spent
    cost = np.where(spent > 0, cost, np.nan)
    beyond = cost - _median_of_others(cost[None, :])[0] if len(cost) > 1 else np.full(len(cost), np.nan)
    excess = {name: values - _median_of_others(values) for name, values in times.phases.items()}
    found = []
    for index in np.flatnonzero((beyond >= min_share) & (held.sum(axis=0) >= MIN_HELD)):
        rows = held[:, index]
        totals = {name: float(np.nansum(values[rows, index])) for name, values in excess.items()}
        phase = max((name for name in PHASES if not np.isnan(times.phases[name][rows, index]).all()),
                    key=lambda name: totals[name])  # fmt: skip
        count = int(rows.sum())
        seconds = float(np.nanmean(times.phases[phase][rows, index]))
        chronic = count > CHRONIC * int(compared[:, index].sum())
        found.append(
            Straggler(int(times.ranks[index]), phase, "chronic" if chronic else "bursts", float(cost[index]),
                      float(np.mean(waited[rows, index])), totals[phase] / count, seconds,
                      seconds - totals[phase] / count, count, int(compared[:, index].sum()),
                      _spans(times.steps, rows, compared[:, index]))
        )  # fmt: skip
    return sorted(found, key=lambda straggler: (-straggler.cost, straggler.rank))


def find_stragglers(table: pd.DataFrame, *, min_share: float = MIN_SHARE) -> pd.DataFrame:
    """The ranks the others wait for, from the telemetry in ``table`` (the long table of ``read_rank_metrics``).

    The rule is the module's (``docs/per-rank-metrics.md``, "The straggler verdict"); each rank's first telemetry row
    (the warm-up) is left out. See :func:`verdict` for the columns.

    Raises:
        ValueError: the table has no telemetry.

    Example:
        >>> rows = []
        >>> for step in range(4):  # rank 1 loads its data 40 ms longer; rank 0 waits for it in the gradient all-reduce
        ...     rows.append({"rank": 0, "step": step, "telemetry/step_s": 0.05, "telemetry/data_wait_s": 0.001,
        ...                  "telemetry/forward_s": 0.004, "telemetry/backward_s": 0.004,
        ...                  "telemetry/collectives_s": 0.0, "telemetry/gradient_wait_s": 0.041})
        ...     rows.append({"rank": 1, "step": step, "telemetry/step_s": 0.05, "telemetry/data_wait_s": 0.041,
        ...                  "telemetry/forward_s": 0.004, "telemetry/backward_s": 0.004,
        ...                  "telemetry/collectives_s": 0.0, "telemetry/gradient_wait_s": 0.001})
        >>> import pandas as pd
        >>> found = find_stragglers(pd.DataFrame(rows))
        >>> found[["rank", "phase", "pattern", "held", "rows", "spans"]]
           rank         phase  pattern  held  rows      spans
        0     1  data loading  chronic     3     3  ((1, 3),)
        >>> round(float(found.at[0, "cost"]), 2), round(float(found.at[0, "excess_s"]), 3)
        (0.8, 0.04)

    """
    return verdict(rank_times(table), min_share=min_share)


def phase_medians(table: pd.DataFrame) -> dict[str, float]:
    """The median over ranks of each rank's median time per batch, by phase, and ``step`` and ``waiting``, in seconds
    (the first row of each rank left out, as by the verdict); phases without values are left out."""
    times = rank_times(table)
    found = {"step": times.step, **times.phases, "waiting": times.wait}
    typical = {}
    for name, values in found.items():
        per_rank = [float(np.nanmedian(column)) for column in values.T if not np.isnan(column).all()]
        if per_rank:
            typical[name] = float(np.median(per_rank))
    return typical


def _spans(steps: NDArray[np.int64], held: NDArray[np.bool_], compared: NDArray[np.bool_]) -> Spans:
    """``(first step, last step)`` of each run of held rows among the compared ones."""
    spans: list[tuple[int, int]] = []
    previous = False
    for step, holds in zip(steps[compared].tolist(), held[compared].tolist(), strict=True):
        if holds and previous:
            spans[-1] = (spans[-1][0], step)
        elif holds:
            spans.append((step, step))
        previous = holds
    return tuple(spans)


def _row_median(values: Matrix) -> Matrix:
    """Each row's median over its cells that are not NaN, as a column (NaN for a row without any)."""
    if not values.size:
        return np.full((values.shape[0], 1), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row without values: NaN, as asked
        return np.nanmedian(values, axis=1, keepdims=True)


def _median_of_others(values: Matrix) -> Matrix:
    """For each cell, the median of the other cells of its row that are not NaN (NaN where there are none, or where
    the cell itself is NaN)."""
    rows, width = values.shape
    if not width:
        return values.copy()
    order = np.argsort(values, axis=1, kind="stable")  # NaN last
    ordered = np.take_along_axis(values, order, axis=1)
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.broadcast_to(np.arange(width), (rows, width)), axis=1)
    others = (~np.isnan(values)).sum(axis=1, keepdims=True) - 1
    low, high = (others - 1) // 2, others // 2  # the middle of the others' sorted values, skipping this cell's place
    low = np.clip(low + (low >= position), 0, width - 1)
    high = np.clip(high + (high >= position), 0, width - 1)
    middle = (np.take_along_axis(ordered, low, axis=1) + np.take_along_axis(ordered, high, axis=1)) / 2
    return np.where((others >= 1) & ~np.isnan(values), middle, np.nan)
