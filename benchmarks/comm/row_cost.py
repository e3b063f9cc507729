"""What one per-rank row costs, in microseconds, with its spread over the repeats.

Two figures per training session, each the median over the repeats with the lowest and highest value:

* **per-rank row**: the row loop's time per row in each timed per-rank fit (see :mod:`benchmarks.comm.training`), in
  CPU time of the main thread and in wall time. This is the absolute cost of one row in a rank's file: capturing
  the local values of the row's two ``self.log`` calls, pairing them with the row, the per-rank logger's
  ``log_metrics`` and its share of the flushes to disk.
* **per training step**: the median step CPU time with per-rank metrics minus stock's, per pair of timed fits (run
  back to back). It holds one per-rank row per step plus whatever else differs, and the noise of a whole step.
* **per-rank row with TensorBoard**: the same row loop in each timed ``tensorboard`` fit (a ``TensorBoardLogger``
  first: the row also goes to the rank's event file), ended by a flush of the event writer, in CPU time of the whole
  process (the writer's thread, which computes each record's CRC and appends it, included) and of the main thread.
* **per-rank row with MLflow, with W&B**: the same row loop in each timed ``mlflow`` and ``wandb`` fit (the row also
  goes to the rank's child run or own run), ended by a flush of the sink, in CPU time of the whole process.
* **telemetry sample**: the sample loop's time per sample in each timed telemetry fit: one batch's phases timed (the
  backward pass's wait marked), and its row written and kept for the live straggler check (the memory read at most
  once a second, as in training), less the backward pass itself; its share of the median step of the fits without
  telemetry; and one reading of the memory on its own.
"""

import statistics
from dataclasses import dataclass, field

from benchmarks.comm.session import SessionResult

_STEP_SUBJECTS = ("training_step/per_rank_metrics", "training_step_cpu/per_rank_metrics")
_EVENTS_SUBJECTS = ("training_step/tensorboard", "training_step_cpu/tensorboard")
_KINDS = ("training_step", "training_step_cpu")

__all__ = ["RecordCost", "RowCost", "Spread", "cost_lines", "record_costs", "record_lines", "row_costs"]


@dataclass(frozen=True)
class Spread:
    """A median over the repeats, and the lowest and highest value."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> "Spread":
        """The spread of ``values`` (at least one)."""
        return cls(statistics.median(values), min(values), max(values))

    def __str__(self) -> str:
        return f"{self.median:.1f} µs (range {self.low:.1f} to {self.high:.1f})"


@dataclass(frozen=True)
class RowCost:
    """The per-rank row's cost in one session (see the module docstring); the JSON ``per_rank_cost`` entry."""

    session: str
    repeats: int
    rows: int
    row_cpu_us: Spread
    row_wall_us: Spread
    step_cpu_us: Spread
    stock_step_cpu_us: float
    sample_cpu_us: Spread | None = None
    sample_wall_us: Spread | None = None
    per_rank_step_us: float = float("nan")
    memory_cpu_us: Spread | None = None
    events_row_cpu_us: Spread | None = None  # CPU time of the whole process: the event writer's thread included
    events_row_thread_cpu_us: Spread | None = None
    events_row_wall_us: Spread | None = None
    sink_row_cpu_us: dict[str, Spread] = field(default_factory=dict)  # MLflow's, W&B's: CPU time of the process
    sink_row_wall_us: dict[str, Spread] = field(default_factory=dict)


def row_costs(results: list[SessionResult]) -> list[RowCost]:
    """One :class:`RowCost` per session that measured the training step."""
    costs = []
    for result in results:
        training = result.training
        if training is None or not training.row_cpu_ns:
            continue
        step_medians = {
            config: [statistics.median(fit) for fit in fits] for config, fits in training.step_cpu_ns.items()
        }
        pairs = zip(step_medians["per_rank_metrics"], step_medians["stock"], strict=True)  # repeat by repeat
        step_cpu = [(ours - stock) / 1000 for ours, stock in pairs]
        costs.append(
            RowCost(
                session=result.spec.label,
                repeats=len(training.row_cpu_ns),
                rows=training.row_loops,
                row_cpu_us=Spread.of([ns / 1000 for ns in training.row_cpu_ns]),
                row_wall_us=Spread.of([ns / 1000 for ns in training.row_ns]),
                step_cpu_us=Spread.of(step_cpu),
                stock_step_cpu_us=statistics.median(step_medians["stock"]) / 1000,
                sample_cpu_us=_spread_us(training.sample_cpu_ns),
                sample_wall_us=_spread_us(training.sample_ns),
                memory_cpu_us=_spread_us(training.memory_cpu_ns),
                per_rank_step_us=statistics.median(map(statistics.median, training.step_ns["per_rank_metrics"])) / 1000,
                events_row_cpu_us=_spread_us(training.events_row_process_cpu_ns),
                events_row_thread_cpu_us=_spread_us(training.events_row_cpu_ns),
                events_row_wall_us=_spread_us(training.events_row_ns),
                sink_row_cpu_us={
                    sink: Spread.of([ns / 1000 for ns in v]) for sink, v in training.sink_row_process_cpu_ns.items()
                },
                sink_row_wall_us={sink: Spread.of([ns / 1000 for ns in v]) for sink, v in training.sink_row_ns.items()},
            )
        )
    return costs


def _spread_us(nanoseconds: list[float]) -> Spread | None:
    return Spread.of([ns / 1000 for ns in nanoseconds]) if nanoseconds else None


def cost_lines(costs: list[RowCost], ratios: dict[tuple[str, str], float]) -> list[str]:
    """The Markdown section: one bullet per figure and session; ``ratios[(session, subject)]`` as in the table."""
    lines = []
    for cost in costs:
        wall, cpu = (ratios.get((cost.session, subject), float("nan")) for subject in _STEP_SUBJECTS)
        lines += [
            f"- {cost.session}, **training step with per-rank metrics: {wall:.3f}x stock in wall time** (target"
            f" ≤ 1.03x), {cpu:.3f}x in CPU time (median of the paired ratios).",
            f"- {cost.session}, **one per-rank row: {cost.row_cpu_us.median:.1f} µs of CPU time** (median over"
            f" {cost.repeats} fits of {cost.rows} rows each; range {cost.row_cpu_us.low:.1f} to"
            f" {cost.row_cpu_us.high:.1f}); wall time {cost.row_wall_us}.",
            f"- {cost.session}, per training step: {cost.step_cpu_us} of CPU time more than stock's"
            f" {cost.stock_step_cpu_us:.1f} µs ({cost.repeats} paired fits; a whole step's noise included).",
        ]
        if (events := cost.events_row_cpu_us) is not None:
            wall, cpu = (ratios.get((cost.session, subject), float("nan")) for subject in _EVENTS_SUBJECTS)
            lines += [
                f"- {cost.session}, **training step with per-rank metrics and a `TensorBoardLogger`: {wall:.3f}x stock"
                f" with the same logger in wall time** (target ≤ 1.03x), {cpu:.3f}x in CPU time of the main thread"
                " (median of the paired ratios).",
                f"- {cost.session}, **one per-rank row with its TensorBoard event: {events.median:.1f} µs of CPU time"
                f" of the process** (the event writer's thread included; range {events.low:.1f} to {events.high:.1f}),"
                f" {cost.events_row_thread_cpu_us} of the main thread; wall time {cost.events_row_wall_us}; the CSV row"
                f" alone, above: {cost.row_cpu_us.median:.1f} µs of the main thread.",
            ]
        for sink, row in cost.sink_row_cpu_us.items():
            name = {"mlflow": "an `MLFlowLogger`", "wandb": "a `WandbLogger`"}[sink]
            wall, cpu = (ratios.get((cost.session, f"{kind}/{sink}"), float("nan")) for kind in _KINDS)
            lines += [
                f"- {cost.session}, **training step with per-rank metrics and {name}: {wall:.3f}x stock with the same"
                f" logger in wall time** (target ≤ 1.03x), {cpu:.3f}x in CPU time of the main thread.",
                f"- {cost.session}, **one per-rank row with its {sink} sink: {row.median:.1f} µs of CPU time of the"
                f" process** (range {row.low:.1f} to {row.high:.1f}); wall time {cost.sink_row_wall_us[sink]}.",
            ]
        if cost.sample_cpu_us is not None:
            telemetry = ratios.get((cost.session, "training_step/telemetry"), float("nan"))
            share = cost.sample_cpu_us.median / cost.per_rank_step_us
            lines += [
                f"- {cost.session}, **training step with telemetry at every step: {telemetry:.3f}x the same run"
                " without it** (target ≤ 1.01x; median of the paired ratios).",
                f"- {cost.session}, **one telemetry sample: {cost.sample_cpu_us.median:.1f} µs of CPU time**,"
                f" {share:.2%} of the median step without telemetry ({cost.per_rank_step_us:.0f} µs) (range"
                f" {cost.sample_cpu_us.low:.1f} to {cost.sample_cpu_us.high:.1f}); wall time {cost.sample_wall_us}."
                f" One reading of the rank's memory (at most one a second): {cost.memory_cpu_us} of CPU time.",
            ]
    return lines


@dataclass(frozen=True)
class RecordCost:
    """Rank 0's CPU time for one decision-record row in one session (the JSON ``record_cost`` entry)."""

    session: str
    rows: int
    cpu_us: Spread
    p90_us: float


def record_costs(results: list[SessionResult]) -> list[RecordCost]:
    """One :class:`RecordCost` per session that timed decisions with the record on rank 0."""
    costs = []
    for result in results:
        decisions = result.decisions
        if decisions is None or not decisions.record_cpu_ns:
            continue
        micros = sorted(ns / 1000 for ns in decisions.record_cpu_ns)
        p90 = micros[min(len(micros) - 1, int(0.9 * len(micros)))]
        costs.append(RecordCost(result.spec.label, len(micros), Spread.of(micros), p90))
    return costs


def record_lines(costs: list[RecordCost]) -> list[str]:
    """The Markdown section: one bullet per session."""
    return [
        f"- {cost.session}, **one decision-record row on rank 0: {cost.cpu_us.median:.1f} µs of CPU time** (median over"
        f" {cost.rows} timed checkpoint decisions of every policy; 90th percentile {cost.p90_us:.1f}, range"
        f" {cost.cpu_us.low:.1f} to {cost.cpu_us.high:.1f}): its sentence, its cells and one `os.write`, once per"
        " decision, not per step."
        for cost in costs
    ]
