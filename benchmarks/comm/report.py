"""From the sessions' raw measurements to result rows, target checks, and the JSON and Markdown files.

Decision rows: median and 90th percentile over every timed decision of the subject; ``ratio_to_stock`` is the
subject's median over the median of the stock subject of the same path, backend, device and world size (same run).
Training rows: the median over the timed fits of each fit's median (and 90th percentile) step time. The ratio pairs
the two fits of each repeat (run back to back) and takes the median of the per-pair ratios of their medians, so
slow drift of the machine cancels; ``ratio_interval`` is a 95% bootstrap interval of that median over the repeats
(:func:`median_interval`), so that a ratio is read with its noise. ``training_step_cpu/...`` rows give the same in
CPU time of the main thread, a diagnostic of the cost itself. ``collectives`` is counted: ``torch.distributed``
calls per decision, or per step.
"""

import datetime
import json
import os
import platform
import random
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning
import torch

import lightning_ext
from benchmarks.comm.decisions import decision_subjects
from benchmarks.comm.plan import SessionSpec
from benchmarks.comm.row_cost import RecordCost, RowCost, cost_lines, record_lines
from benchmarks.comm.session import SessionResult
from benchmarks.comm.stall_cost import StallCost, stall_lines
from benchmarks.comm.sync_cost import SyncCost, sync_lines
from benchmarks.comm.training import BASELINES
from benchmarks.helpers.machine import load_average
from lightning_ext.strategies import _runtime

__all__ = [
    "LATENCY_TARGET",
    "STEP_TARGET",
    "Row",
    "Target",
    "build_rows",
    "check_targets",
    "markdown",
    "median_interval",
    "metadata",
    "write_json",
]

LATENCY_TARGET = 1.10
STEP_TARGET = 1.03


@dataclass(frozen=True)
class Row:
    """One measured subject in one session (the JSON row)."""

    backend: str
    device: str
    world_size: int
    subject: str
    median_us: float
    p90_us: float
    ratio_to_stock: float
    collectives: float
    collectives_by_name: dict[str, float] = field(default_factory=dict)
    mean_us: float = 0.0
    samples: int = 0
    ratio_interval: tuple[float, float] | None = None
    received_bytes: float = 0.0  # decisions: the bytes of the tensors a rank's collectives fill, per decision

    @property
    def is_policy(self) -> bool:
        """A lightning-ext decision subject (not stock, not a training step)."""
        path, _, name = self.subject.partition("/")
        return path in ("checkpoint", "early_stopping") and name != "stock"


@dataclass(frozen=True)
class Target:
    """One target check: ``value`` against ``limit`` (``<=``, or ``==`` for counts)."""

    name: str
    where: str
    value: float
    limit: float
    comparison: str
    met: bool
    interval: tuple[float, float] | None = None

    def verdict(self) -> str:
        """``met`` or ``**missed**`` by the value (a ratio's median); for a ratio, what its 95% interval says too:
        wholly on the same side of the limit, or reaching across it (the run does not settle the target)."""
        word = "met" if self.met else "**missed**"
        if self.interval is None or self.comparison != "<=":
            return word
        low, high = self.interval
        if high <= self.limit or low > self.limit:
            return f"{word} (the whole 95% interval {'under' if high <= self.limit else 'over'} the limit)"
        return f"{word} by the median (the 95% interval reaches {'over' if self.met else 'under'} the limit)"


# per-rank metrics may cost up to 3% of a step; telemetry at every step, 1% of the same run without it (issue targets)
_STEP_TARGETS = {
    "training_step/per_rank_metrics": STEP_TARGET,
    "training_step/tensorboard": STEP_TARGET,  # against stock with the same TensorBoardLogger
    "training_step/mlflow": STEP_TARGET,  # against stock with the same MLFlowLogger
    "training_step/wandb": STEP_TARGET,  # against stock with the same WandbLogger
    "training_step/telemetry": 1.01,
}
# the default hang checks must stay within stock-against-itself noise: their ratio at most the upper end of the
# 95% interval of the stock twin's ratio, in the same session (with 1 and with 5 synced values per step); so must the
# stall report, against the same run with it off
_NOISE_TARGETS = {
    "training_step/hang_checks": "training_step/stock_twin",
    "training_step/hang_checks_5_synced": "training_step/stock_5_synced_twin",
    "training_step/stall_report": "training_step/stock_twin",  # against stall_off: the stall report's own cost
}


def _percentile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def median_interval(ratios: list[float], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``ratios`` (percentile method, seeded: the same data, the same).

    >>> median_interval([1.0, 1.0, 1.0])
    (1.0, 1.0)
    >>> low, high = median_interval([0.9, 1.0, 1.1, 1.2, 0.8])
    >>> 0.8 <= low <= high <= 1.2
    True
    """
    draw = random.Random(seed)
    medians = sorted(statistics.median(draw.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def _rows_of(result: SessionResult) -> list[Row]:
    spec: SessionSpec = result.spec
    rows: list[Row] = []
    if result.decisions is not None:
        for subject in decision_subjects():  # report order: the checkpoint path, then early stopping
            micros = [ns / 1000 for ns in result.decisions.samples_ns[subject]]
            stock = [ns / 1000 for ns in result.decisions.samples_ns[subject.split("/")[0] + "/stock"]]
            counts = result.decisions.collectives[subject]
            rows.append(
                Row(
                    spec.backend,
                    spec.device,
                    spec.world_size,
                    subject=subject,
                    median_us=statistics.median(micros),
                    p90_us=_percentile(micros, 90),
                    ratio_to_stock=statistics.median(micros) / statistics.median(stock),
                    collectives=sum(counts.values()),
                    collectives_by_name=counts,
                    mean_us=statistics.fmean(micros),
                    samples=len(micros),
                    received_bytes=result.decisions.received_bytes.get(subject, 0.0),
                )
            )
    training = result.training
    if training is not None:
        for prefix, measured in (("training_step", training.step_ns), ("training_step_cpu", training.step_cpu_ns)):
            rows.extend(_training_rows(spec, prefix, measured, training.collectives_per_step))
    return rows


def _training_rows(
    spec: SessionSpec, prefix: str, measured: dict[str, list[list[int]]], per_step: dict[str, dict[str, float]]
) -> list[Row]:
    runs_us = {config: [[ns / 1000 for ns in run] for run in runs] for config, runs in measured.items()}
    fit_medians = {config: [statistics.median(run) for run in runs] for config, runs in runs_us.items()}
    rows = []
    for config, runs in runs_us.items():
        pooled = [us for run in runs for us in run]
        baseline = BASELINES.get(config, "stock")
        pairs = zip(fit_medians[config], fit_medians[baseline], strict=True)  # repeat by repeat, back to back
        ratios = [ours / stock for ours, stock in pairs]
        rows.append(
            Row(
                spec.backend,
                spec.device,
                spec.world_size,
                subject=f"{prefix}/{config}",
                median_us=statistics.median(fit_medians[config]),
                p90_us=statistics.median([_percentile(run, 90) for run in runs]),
                ratio_to_stock=statistics.median(ratios),
                collectives=sum(per_step[config].values()),
                collectives_by_name=per_step[config],
                mean_us=statistics.fmean(pooled),
                samples=len(pooled),
                ratio_interval=median_interval(ratios),
            )
        )
    return rows


def build_rows(results: list[SessionResult]) -> list[Row]:
    """Every row of every session that measured something, in session order."""
    return [row for result in results for row in _rows_of(result)]


def check_targets(rows: list[Row]) -> list[Target]:
    """The targets: per policy row (latency, collectives), per training comparison (step time, collectives)."""
    targets: list[Target] = []
    for row in rows:
        where = f"{row.backend}/{row.device} W={row.world_size} {row.subject}"
        if row.is_policy:
            ratio = row.ratio_to_stock
            targets.append(
                Target("decision latency vs stock", where, ratio, LATENCY_TARGET, "<=", ratio <= LATENCY_TARGET)
            )
            expected = 1.0 if row.world_size > 1 else 0.0
            targets.append(
                Target("collectives per decision", where, row.collectives, expected, "==", row.collectives == expected)
            )
        if row.subject in _STEP_TARGETS or row.subject in _NOISE_TARGETS:
            same = [r for r in rows if (r.backend, r.world_size) == (row.backend, row.world_size)]
            ratio, interval = row.ratio_to_stock, row.ratio_interval
            if row.subject in _STEP_TARGETS:
                limit, name = _STEP_TARGETS[row.subject], "training step vs stock"
            else:
                twin = next(r for r in same if r.subject == _NOISE_TARGETS[row.subject])
                limit = twin.ratio_interval[1] if twin.ratio_interval else twin.ratio_to_stock
                name = "training step vs stock, within stock's noise (the twin's upper bound)"
            targets.append(Target(name, where, ratio, limit, "<=", ratio <= limit, interval))
            baseline = "training_step/" + BASELINES.get(row.subject.split("/")[1], "stock")
            stock = next(r for r in same if r.subject == baseline)
            extra = row.collectives - stock.collectives
            # none added; the coalesced sync makes fewer (no barrier per synced value)
            targets.append(Target("extra collectives per logging step", where, extra, 0.0, "<=", extra <= 0.0))
    return targets


def write_json(
    path: Path,
    rows: list[Row],
    targets: list[Target],
    metadata: dict[str, Any],
    costs: list[RowCost],
    syncs: list[SyncCost],
    records: list[RecordCost],
    stalls: list[StallCost],
) -> None:
    """``{"metadata": ..., "rows": [...], "targets": [...], "per_rank_cost": [...], "sync_point": [...],
    "record_cost": [...], "stall_cost": [...]}``."""
    document = {
        "metadata": metadata,
        "rows": [asdict(r) for r in rows],
        "targets": [asdict(t) for t in targets],
        "per_rank_cost": [asdict(c) for c in costs],
        "sync_point": [asdict(s) for s in syncs],
        "record_cost": [asdict(r) for r in records],
        "stall_cost": [asdict(s) for s in stalls],
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def _verdict(row: Row, targets: list[Target]) -> str:
    where = f"{row.backend}/{row.device} W={row.world_size} {row.subject}"
    mine = [t for t in targets if t.where == where]
    if not mine:
        stock = ("/stock", "/stock_stream", "/stock_5_synced", "/stock_tensorboard", "/stock_mlflow", "/stock_wandb")
        if row.subject.endswith(stock):
            return "baseline"
        if row.subject.endswith("_twin"):
            return "noise: stock against itself"
        return "diagnostic (CPU time)" if row.subject.startswith("training_step_cpu/") else ""
    return "; ".join(f"{_short(t)} {t.verdict()}" for t in mine)


def _short(target: Target) -> str:
    if target.name == "extra collectives per logging step":
        return f"≤ {target.limit:g} extra collectives/step"
    if target.comparison == "<=":
        return f"≤ {target.limit:.2f}x"
    unit = "/step extra" if "step" in target.name else "/decision"
    return f"{target.limit:g} collective{'' if target.limit == 1 else 's'}{unit}"


def _ratio(row: Row) -> str:
    if row.ratio_interval is None or row.ratio_interval[0] == row.ratio_interval[1]:
        return f"{row.ratio_to_stock:.3f}"
    return f"{row.ratio_to_stock:.3f} ({row.ratio_interval[0]:.3f}-{row.ratio_interval[1]:.3f})"


def _names(counts: dict[str, float]) -> str:
    return ", ".join(f"{name} {n:g}" for name, n in counts.items()) or "none"


def markdown(
    rows: list[Row],
    targets: list[Target],
    metadata: dict[str, Any],
    costs: list[RowCost],
    syncs: list[SyncCost],
    records: list[RecordCost],
    stalls: list[StallCost],
) -> str:
    """The table, its targets marked met or missed, the per-rank row's and the checks' own cost, what was measured."""
    lines = [
        f"# Communication overhead: {metadata['machine']}",
        "",
        f"{metadata['date']}; torch {metadata['torch']}, lightning {metadata['lightning']}, "
        f"{metadata['cpu_count']} CPUs{', ' + metadata['cuda_device'] if metadata.get('cuda_device') else ''}; "
        f"{metadata['counts']['decisions']} decisions per subject, {metadata['counts']['warmup']} warm-up rounds, "
        f"{metadata['counts']['repeats']} x {metadata['counts']['train_steps']} timed training steps per"
        f" configuration. Load average (1, 5, 15 min) before: {metadata['load_average_before']}, after:"
        f" {metadata['load_average_after']}.",
        "",
        "Training ratios carry a 95% bootstrap interval over the repeats, in brackets; `stock_twin` shows the noise.",
        "",
        "Bytes: what a rank's collectives fill per decision (a decision's all-to-all: every rank's row; stock: the"
        " all-reduced flag and its barrier).",
        "",
        "| backend | device | world size | subject | median µs | p90 µs | ratio to stock | collectives | bytes |"
        " target |",
        "|---|---|---:|---|---:|---:|---:|---|---:|---|",
    ]
    for row in rows:
        per = "step" if row.subject.startswith("training_step") else "decision"
        size = "" if per == "step" else f"{row.received_bytes:g}"
        lines.append(
            f"| {row.backend} | {row.device} | {row.world_size} | `{row.subject}` | {row.median_us:.1f} | "
            f"{row.p90_us:.1f} | {_ratio(row)} | {row.collectives:g}/{per}"
            f" ({_names(row.collectives_by_name)}) | {size} | {_verdict(row, targets)} |"
        )
    if costs:
        ratios = {(f"{r.backend}/{r.device} W={r.world_size}", r.subject): r.ratio_to_stock for r in rows}
        lines += ["", "## Per-rank row cost", "", *cost_lines(costs, ratios)]
    if records:
        lines += ["", "## Decision record row cost", "", *record_lines(records)]
    if syncs:
        lines += ["", "## Time per step lining the ranks up (barrier or check)", "", *sync_lines(syncs)]
    if stalls:
        lines += ["", "## The stall report's cost per step", "", *stall_lines(stalls)]
    lines += ["", "## Targets", ""]
    for name in dict.fromkeys(t.name for t in targets):
        mine = [t for t in targets if t.name == name]
        missed = [t for t in mine if not t.met]
        limits = " or ".join(f"{t.comparison} {t.limit:g}" for t in {t.limit: t for t in mine}.values())
        by = " by the median" if any(t.interval is not None for t in mine) else ""
        lines.append(f"- {name} ({limits}): {len(mine) - len(missed)}/{len(mine)} met{by}")
        lines += [f"  - missed: {t.where}: {t.value:.3f}" for t in missed]
        for target in mine:
            if target.interval is None:
                continue
            low, high = target.interval
            lines.append(
                f"  - {target.where}: {target.value:.3f}, 95% interval {low:.3f}-{high:.3f} against {target.limit:g}:"
                f" {target.verdict()}"
            )
    lines += ["", "## Notes", ""] + [f"- {note}" for note in metadata.get("notes", [])]
    return "\n".join(lines) + "\n"


def metadata(
    *, machine: str, counts: dict[str, Any], notes: list[str], load_before: list[float] | None
) -> dict[str, Any]:
    """Versions, hardware, the counts used, the date, the load before and after, and the notes on the method."""
    return {
        "machine": machine,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.comm", *sys.argv[1:]]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "lightning_ext": lightning_ext.__version__,
        "patch_mode": _runtime.patch_mode(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "counts": counts,
        "notes": notes,
    }
