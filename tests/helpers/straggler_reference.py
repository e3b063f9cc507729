"""An independent reference for the straggler verdict and the per-host memory check: plain Python, no lightning_ext.

Written from the rules as docs/per-rank-metrics.md states them, with the statistics module instead of pandas.
"""

from __future__ import annotations

import math
import statistics

VERDICT = {"step": "telemetry/step_s", "data wait": "telemetry/data_wait_s", "forward": "telemetry/forward_s",
           "optimizer": "telemetry/optimizer_s"}  # fmt: skip


def robust_z(values: dict[int, float]) -> dict[int, float]:
    """``0.6745 (x - median) / MAD``; the mean absolute deviation (x 0.7979) when MAD is 0; else 0 or +-inf."""
    finite = {key: value for key, value in values.items() if not math.isnan(value)}
    if not finite:
        return {}
    median = statistics.median(finite.values())
    deviations = [abs(value - median) for value in finite.values() if math.isfinite(value - median)]
    mad = statistics.median(deviations) if deviations else 0.0
    mean_ad = statistics.fmean(deviations) if deviations else 0.0
    z = {}
    for key, value in finite.items():
        deviation = value - median
        if deviation == 0:
            z[key] = 0.0
        elif mad > 0:
            z[key] = 0.6745 * deviation / mad
        elif mean_ad > 0:
            z[key] = 0.7979 * deviation / mean_ad
        else:
            z[key] = math.copysign(math.inf, deviation)
    return z


def stragglers(
    samples: dict[int, list[dict[str, float]]], threshold: float = 3.5, min_share: float = 0.05
) -> set[tuple[int, str]]:
    """``{(rank, phase)}`` flagged, from each rank's telemetry rows (``{column: seconds}``, NaN for a missing cell)."""
    typical: dict[str, dict[int, float]] = {phase: {} for phase in VERDICT}
    for rank, rows in samples.items():
        for phase, column in VERDICT.items():
            present = [row[column] for row in rows if column in row and not math.isnan(row[column])]
            if present:
                typical[phase][rank] = statistics.median(present)
    steps = list(typical["step"].values())
    step = statistics.median(steps) if steps else math.nan
    flagged = set()
    for phase, values in typical.items():
        if not values:
            continue
        median = statistics.median(values.values())
        for rank, z in robust_z(values).items():
            if z > threshold and step > 0 and values[rank] - median >= min_share * step:
                flagged.add((rank, phase))
    return flagged


def host_peaks(
    rows: list[tuple[int, int, float, float, float]], hosts: dict[int, tuple[str, float]], share: float = 0.5
) -> dict[str, tuple[int, float, bool]]:
    """``{host: (peak step, held, warn)}`` from ``(rank, step, rss, workers_rss, host_used)`` rows.

    At each step, each of the host's ranks counts with its latest reading at or before it (steps before every rank
    has one are left out); workers' NaN is 0; the sum is capped by the largest ``host_used`` among those readings.
    """
    last: dict[tuple[int, int], tuple[float, float, float]] = {}
    for rank, step, rss, workers, used in rows:
        last[(rank, step)] = (rss, 0.0 if math.isnan(workers) else workers, math.inf if math.isnan(used) else used)
    result = {}
    for host in sorted({name for name, _ in hosts.values()}):
        ranks = sorted({rank for rank, _ in last if hosts[rank][0] == host})
        if not ranks:
            continue
        held: dict[int, float] = {}
        for step in sorted({step for rank, step in last if rank in ranks}):
            readings = []
            for rank in ranks:
                earlier = [at for who, at in last if who == rank and at <= step]
                if earlier:
                    readings.append(last[(rank, max(earlier))])
            if len(readings) == len(ranks):
                total = sum(rss + workers for rss, workers, _ in readings)
                held[step] = min(total, max(used for _, _, used in readings))
        peak = max(sorted(held), key=lambda step: held[step])
        memory = max(size for name, size in hosts.values() if name == host)
        result[host] = (peak, held[peak], held[peak] > share * memory)
    return result
