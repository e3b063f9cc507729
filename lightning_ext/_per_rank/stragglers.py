"""The straggler verdict, read from the telemetry columns of the per-rank files."""

import math

import pandas as pd

from lightning_ext._per_rank.csv_format import (
    BACKWARD_S,
    COLLECTIVES_S,
    DATA_WAIT_S,
    FORWARD_S,
    OPTIMIZER_S,
    STEP_S,
)
from lightning_ext._per_rank.spread import OUTLIER, robust_z

__all__ = ["MIN_SHARE", "VERDICT_PHASES", "find_stragglers", "phase_medians"]

VERDICT_PHASES = {STEP_S: "step", DATA_WAIT_S: "data wait", FORWARD_S: "forward", OPTIMIZER_S: "optimizer"}
MIN_SHARE = 0.05  # a straggler's excess costs at least this share of the median step
_STRAGGLER_COLUMNS = ["rank", "phase", "seconds", "median", "ratio", "excess_s", "share", "robust_z", "samples"]


def find_stragglers(table: pd.DataFrame, *, threshold: float = OUTLIER, min_share: float = MIN_SHARE) -> pd.DataFrame:
    """The ranks slower than the others in a phase of the training step, by the summary's robust rule.

    Each rank's time per batch in a phase is the median over its telemetry rows. A rank is a straggler in a phase
    when that time's robust z-score among the ranks (:func:`~lightning_ext.rank_spread.robust_z`) is above
    ``threshold`` and its excess over the ranks' median is at least ``min_share`` of the median step time. Phases:
    ``step``, ``data wait``, ``forward``, ``optimizer``; not backward or collectives, which under DDP hold each
    rank's wait for the others (``docs/per-rank-metrics.md``).

    Returns:
        One row per (rank, phase), the largest excess first: ``rank``, ``phase``, ``seconds`` (the rank's time per
        batch), ``median`` (the ranks' median), ``ratio`` (``seconds / median``), ``excess_s``, ``share`` (of the
        median step), ``robust_z``, ``samples`` (the rank's telemetry rows).

    Raises:
        ValueError: the table has no telemetry.

    Example:
        >>> table = pd.DataFrame({"rank": [0, 0, 1, 1, 2, 2, 3, 3], "step": [0, 1] * 4,
        ...                       "telemetry/step_s": [0.1] * 8,
        ...                       "telemetry/data_wait_s": [0.01, 0.012, 0.09, 0.08, 0.012, 0.01, 0.013, 0.011]})
        >>> found = find_stragglers(table)
        >>> found[["rank", "phase", "seconds", "median", "samples"]]
           rank      phase  seconds  median  samples
        0     1  data wait    0.085  0.0115        2
        >>> round(float(found.at[0, "ratio"]), 2), round(float(found.at[0, "excess_s"]), 4)
        (7.39, 0.0735)

    """
    columns = [column for column in VERDICT_PHASES if column in table.columns]
    if STEP_S not in columns:
        raise ValueError(
            f"The table has no {STEP_S!r} column: the per-rank files hold no telemetry"
            " (turn it on with PerRankMetrics(telemetry=True))"
        )
    sampled = table[table[STEP_S].notna()]
    typical = sampled.groupby("rank")[columns].median()
    samples = sampled.groupby("rank")[STEP_S].count()
    step = float(typical[STEP_S].median()) if len(typical) else math.nan
    found = []
    for column in columns:
        z, _ = robust_z(typical[column])
        median = float(typical[column].median())
        for rank in z.index[z > threshold]:
            seconds = float(typical.at[rank, column])
            excess = seconds - median
            if step > 0 and excess >= min_share * step:
                ratio = seconds / median if median > 0 else math.inf
                share = excess / step
                record = [
                    int(rank),
                    VERDICT_PHASES[column],
                    seconds,
                    median,
                    float(ratio),
                    excess,
                    share,
                    float(z[rank]),
                ]
                found.append([*record, int(samples[rank])])
    result = pd.DataFrame(found, columns=_STRAGGLER_COLUMNS)
    result = result.sort_values(["excess_s", "rank"], ascending=[False, True], kind="stable")
    return result.reset_index(drop=True)


def phase_medians(table: pd.DataFrame) -> dict[str, float]:
    """The median over ranks of each rank's median time per batch, by phase (the phases present), in seconds."""
    phases = {**VERDICT_PHASES, BACKWARD_S: "backward", COLLECTIVES_S: "collectives"}
    columns = [column for column in phases if column in table.columns]
    if STEP_S not in columns:
        return {}
    typical = table[table[STEP_S].notna()].groupby("rank")[columns].median()
    order = ["step", "data wait", "forward", "backward", "optimizer", "collectives"]
    found = {phases[column]: float(typical[column].median()) for column in columns}
    return {phase: found[phase] for phase in order if phase in found}
