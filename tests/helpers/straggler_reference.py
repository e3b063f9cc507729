"""An independent reference for the straggler verdict and the per-host memory check: plain Python, no lightning_ext.

Written from the rules as docs/per-rank-metrics.md states them, with the statistics module instead of numpy and
pandas, row by row and rank by rank.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

PHASES = {"data loading": "telemetry/data_wait_s", "forward": "telemetry/forward_s",
          "backward compute": "telemetry/backward_s", "optimizer": "telemetry/optimizer_s"}  # fmt: skip
WAITS = ("telemetry/collectives_s", "telemetry/gradient_wait_s")


@dataclass
class Straggler:
    phase: str
    pattern: str
    cost: float
    held: int
    rows: int
    spans: list[tuple[int, int]] = field(default_factory=list)


def stragglers(samples: dict[int, list[dict[str, float]]], min_share: float = 0.05) -> dict[int, Straggler]:
    """``{rank: Straggler}`` from each rank's telemetry rows, in file order (``{"step": s, column: seconds}``, every
    time column present, one row per step), by the rule docs/per-rank-metrics.md states."""
    times: dict[int, dict[int, dict[str, float]]] = {}  # rank -> step -> quantity
    for rank, rows in samples.items():
        for row in rows[1:]:  # the first row is the warm-up
            wait = sum(row[column] for column in WAITS)
            own = row["telemetry/step_s"] - wait
            parts = {phase: row[column] for phase, column in PHASES.items()}
            parts["hooks and logging"] = own - sum(parts.values())
            times.setdefault(rank, {})[int(row["step"])] = {"step": row["telemetry/step_s"], "wait": wait, "own": own,
                                                            **parts}  # fmt: skip
    steps = sorted({step for by_step in times.values() for step in by_step})
    tally = {rank: {"compared": [], "held": [], "lost": 0.0, "spent": 0.0, "excess": {}} for rank in times}
    for step in steps:
        present = {rank: by_step[step] for rank, by_step in times.items() if step in by_step}
        reference = statistics.median(row["step"] for row in present.values())
        for rank, row in present.items():
            others = [other for who, other in present.items() if who != rank]
            if not others:
                continue
            waited = statistics.median(other["wait"] for other in others) - row["wait"]
            lag = row["own"] - statistics.median(other["own"] for other in others)
            mine = tally[rank]
            mine["compared"].append(step)
            mine["spent"] += reference
            if waited >= min_share * reference and lag >= min_share * reference:
                mine["held"].append(step)
                mine["lost"] += min(waited, lag)
                for phase in [*PHASES, "hooks and logging"]:
                    excess = row[phase] - statistics.median(other[phase] for other in others)
                    mine["excess"][phase] = mine["excess"].get(phase, 0.0) + excess
    cost = {rank: mine["lost"] / mine["spent"] for rank, mine in tally.items() if mine["spent"] > 0}
    found = {}
    for rank, share in cost.items():
        others = [other for who, other in cost.items() if who != rank]
        mine = tally[rank]
        if not others or share - statistics.median(others) < min_share or len(mine["held"]) < 2:
            continue  # a rank that held the others back in one row only: a one-off
        phase = max([*PHASES, "hooks and logging"], key=lambda name: mine["excess"][name])  # ties: the first
        held, compared = mine["held"], mine["compared"]
        spans: list[tuple[int, int]] = []
        for index, step in enumerate(compared):
            if step in held:
                if index and compared[index - 1] in held:
                    spans[-1] = (spans[-1][0], step)
                else:
                    spans.append((step, step))
        pattern = "chronic" if len(held) > 0.5 * len(compared) else "bursts"
        found[rank] = Straggler(phase, pattern, share, len(held), len(compared), spans)
    return found


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
