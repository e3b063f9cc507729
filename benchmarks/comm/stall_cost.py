"""What the stall report's watching costs the training thread per step, in microseconds, beside the step it is in.

Per training session, the median over the timed ``stall_report`` fits (with the lowest and highest value) of the watch
loop's time per step's worth of watching (see :mod:`benchmarks.comm.training`): three counted collective calls and
one noted backward pass, the bare loop subtracted, and its share of the median step of the ``stall_off`` fits. The
step-time ratio of ``stall_report`` to ``stall_off`` holds the same cost plus a whole step's noise.
"""

import statistics
from dataclasses import dataclass

from benchmarks.comm.row_cost import Spread
from benchmarks.comm.session import SessionResult

__all__ = ["StallCost", "stall_costs", "stall_lines"]


@dataclass(frozen=True)
class StallCost:
    """The stall report's cost per step in one session; the JSON ``stall_cost`` entry.

    Attributes:
        session: the session's label.
        repeats: timed ``stall_report`` fits.
        loops: steps' worth of watching per fit.
        cpu_us: per step, in CPU time of the main thread.
        wall_us: per step, in wall time.
        step_us: the median step of the ``stall_off`` fits (wall time).

    """

    session: str
    repeats: int
    loops: int
    cpu_us: Spread
    wall_us: Spread
    step_us: float


def stall_costs(results: list[SessionResult]) -> list[StallCost]:
    """One :class:`StallCost` per session that timed ``stall_report`` fits."""
    costs = []
    for result in results:
        training = result.training
        if training is None or not training.watch_cpu_ns:
            continue
        costs.append(
            StallCost(
                session=result.spec.label,
                repeats=len(training.watch_cpu_ns),
                loops=training.row_loops,
                cpu_us=Spread.of([ns / 1000 for ns in training.watch_cpu_ns]),
                wall_us=Spread.of([ns / 1000 for ns in training.watch_ns]),
                step_us=statistics.median(map(statistics.median, training.step_ns["stall_off"])) / 1000,
            )
        )
    return costs


def stall_lines(costs: list[StallCost]) -> list[str]:
    """The Markdown section: one bullet per session."""
    return [
        f"- {cost.session}, **the stall report's watching: {cost.cpu_us.median:.1f} µs of CPU time per step**,"
        f" {cost.cpu_us.median / cost.step_us:.2%} of the median step without it ({cost.step_us:.0f} µs): three"
        f" counted collective calls and a noted backward pass (median over {cost.repeats} fits of {cost.loops}"
        f" steps' worth; range {cost.cpu_us.low:.1f} to {cost.cpu_us.high:.1f}); wall time {cost.wall_us}."
        for cost in costs
    ]
