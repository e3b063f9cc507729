"""The chart: each subject's ratio to stock, per session, with the target lines.

Left: every policy's decision latency over the stock decision's (checkpoint and early-stopping paths), one bar per
session (backend, device, world size), with the 1.10 target. Right: the training-step time with per-rank metrics
over stock, with the 1.03 target. Drawn with matplotlib's object-oriented API on the Agg canvas (no display needed).
"""

from pathlib import Path

from matplotlib.figure import Figure

from benchmarks.comm.report import LATENCY_TARGET, STEP_TARGET, Row

__all__ = ["write_chart"]


def _session(row: Row) -> str:
    return f"{row.backend}/{row.device} W={row.world_size}"


def write_chart(path: Path, rows: list[Row], *, title: str) -> None:
    """Draw the ratios of ``rows`` to ``path`` (PNG): one marker per subject and session, on a 1.0 baseline."""
    decisions = [row for row in rows if row.is_policy]
    steps = [row for row in rows if row.subject == "training_step/per_rank_metrics"]
    figure = Figure(figsize=(14, 5.5), layout="constrained")
    left, right = figure.subplots(1, 2, width_ratios=[5, 1])

    subjects = list(dict.fromkeys(row.subject for row in decisions))
    sessions = list(dict.fromkeys(_session(row) for row in decisions))
    spread = 0.6 / max(1, len(sessions))
    for index, session in enumerate(sessions):
        ratio = {row.subject: row.ratio_to_stock for row in decisions if _session(row) == session}
        shift = (index - (len(sessions) - 1) / 2) * spread
        positions = [i + shift for i, subject in enumerate(subjects) if subject in ratio]
        left.plot(positions, [ratio[s] for s in subjects if s in ratio], "o", markersize=7, label=session)
    left.axhline(LATENCY_TARGET, color="crimson", linestyle="--", linewidth=1, label=f"target {LATENCY_TARGET:.2f}x")
    left.axhline(1.0, color="grey", linewidth=0.8, label="stock")
    left.set_xticks(range(len(subjects)), subjects, rotation=45, ha="right", fontsize=8)
    left.set_xlim(-0.6, len(subjects) - 0.4)
    left.set_ylabel("median latency / stock median")
    left.set_title("Per-decision latency, ratio to the stock decision (same path and session)")
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=8)

    right.plot(range(len(steps)), [row.ratio_to_stock for row in steps], "s", color="tab:green", markersize=8)
    right.axhline(STEP_TARGET, color="crimson", linestyle="--", linewidth=1, label=f"target {STEP_TARGET:.2f}x")
    right.axhline(1.0, color="grey", linewidth=0.8, label="stock")
    right.set_xticks(range(len(steps)), [_session(row) for row in steps], fontsize=8)
    right.set_xlim(-0.6, len(steps) - 0.4)
    right.set_ylabel("median step time / stock median")
    right.set_title("Training step,\nper-rank metrics / stock")
    right.grid(axis="y", alpha=0.3)
    right.legend(fontsize=8)
    for axes, target in ((left, LATENCY_TARGET), (right, STEP_TARGET)):
        values = [y for line in axes.get_lines() for y in line.get_ydata()]
        low, high = min([1.0, *values]), max([target, *values])
        margin = 0.1 * (high - low) + 0.01
        axes.set_ylim(low - margin, high + margin)
    figure.suptitle(title)
    figure.savefig(path, dpi=120)
