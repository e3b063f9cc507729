"""The figures at scale the docs quote: the check's channel, launched fits to 32 ranks, the pitfall at 32, the model.

Each comes from its own results file beside the comm benchmark's (``channel-``, ``fits-``, ``pitfall-<machine>.json``);
the model's table is computed from :mod:`benchmarks.channel.model` and the round time measured by the channel's.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.channel import model
from benchmarks.channel import report as channel_report
from benchmarks.fits import pitfall
from benchmarks.fits import report as fits_report

__all__ = ["FIGURES", "PAGES", "round_us"]


def path_of(results: Path, kind: str) -> Path:
    """The results file of ``kind`` beside the comm benchmark's ``results`` file."""
    return results.with_name(f"{kind}-{results.stem}.json")


def _needed(document: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    if document is None:
        raise ValueError(f"there are no {kind} results beside the results file (python -m benchmarks.{kind})")
    return document


def round_us(channel: dict[str, Any]) -> float:
    """Python's time per round of a check, measured: the check's CPU time at 2 ranks (one round), median."""
    row = next(r for r in channel["rows"] if (r["world_size"], r["busy"], r["subject"]) == (2, False, "check"))
    return float(row["cpu_p50_us"])


def _channel_table(channel: dict[str, Any]) -> str:
    subjects = ("check", "barrier", "all_reduce", "broadcast")
    lines = [
        "| ranks | GIL-competing thread | " + " | ".join(f"`{s}` p50 (p99)" for s in subjects) + " |",
        "|---:|---|" + "---:|" * len(subjects),
    ]
    rows = {(r["world_size"], r["busy"], r["subject"]): r for r in channel["rows"]}
    for size in sorted({r["world_size"] for r in channel["rows"]}):
        for busy in (False, True):
            cells = [rows[size, busy, s] for s in subjects]
            text = " | ".join(f"{_ms(c['p50_us'])} ({_ms(c['p99_us'])})" for c in cells)
            lines.append(f"| {size} | {'yes' if busy else 'no'} | {text} |")
    return "\n" + "\n".join(lines) + "\n"


def _ms(micros: float) -> str:
    return f"{micros / 1000:.2f} ms" if micros < 10_000 else f"{micros / 1000:.0f} ms"


def _model_table(channel: dict[str, Any]) -> str:
    rounds_us = round_us(channel)
    fast = {(r["world_size"], r["values"]): r for r in model.model_rows(rounds_us, alpha_us=model.FAST_ALPHA_US)}
    lines = [
        "| ranks | synced values | check rounds | stock: NCCL calls | the check, then one NCCL all-reduce"
        f" (alpha {model.ALPHA_US:.0f} µs) | the same, alpha {model.FAST_ALPHA_US:.0f} µs (not measured)"
        " | the check as gloo's ring all-reduce |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in model.model_rows(rounds_us):
        other = fast[row["world_size"], row["values"]]
        lines.append(
            f"| {row['world_size']:,} | {row['values']} | {row['rounds']:.0f} | {row['stock_us']:,.0f} µs"
            f" | {row['ours_us']:,.0f} µs ({row['ours_us'] / row['stock_us']:.2f}x)"
            f" | {other['ours_us']:,.0f} µs ({other['ours_us'] / row['stock_us']:.2f}x)"
            f" | {row['ring_us']:,.0f} µs ({row['ring_us'] / row['stock_us']:.1f}x) |"
        )
    return "\n" + "\n".join(lines) + "\n"


def _model_verdict(channel: dict[str, Any]) -> str:
    """Where the check (and one NCCL all-reduce) is ahead of stock and where behind, on each network, by values."""
    parts = []
    for alpha in (model.ALPHA_US, model.FAST_ALPHA_US):
        rows = model.model_rows(round_us(channel), alpha_us=alpha)
        said = []
        for count in sorted({row["values"] for row in rows}):
            mine = [row for row in rows if row["values"] == count]
            behind = [f"{row['world_size']:,}" for row in mine if row["ours_us"] > row["stock_us"]]
            ratios = [row["ours_us"] / row["stock_us"] for row in mine]
            where = f"behind at {', '.join(behind)} ranks" if behind else "ahead at every size"
            said.append(f"{count} value(s): {min(ratios):.2f}-{max(ratios):.2f}x stock's, {where}")
        parts.append(f"with alpha {alpha:.0f} µs, " + "; ".join(said))
    return ". ".join(parts)


def _nccl_parameters() -> str:
    base, nvlink, network = model.NCCL_LATENCY_US
    return f"{base:.1f} µs, then {nvlink:.2f} µs per NVLink step and {network:.0f} µs per network step"


def _grid(fits: dict[str, Any]) -> str:
    """``W = 2, 4, 8 and 16 (2, 1, 1, 1 repeats), 15 timed steps per fit``: what the launched fits ran."""
    counts = fits["metadata"]["counts"]
    sizes = sorted(counts["world_sizes"])
    repeats = ", ".join(str(counts["repeats"][str(size)]) for size in sizes)
    listed = ", ".join(map(str, sizes[:-1])) + f" and {sizes[-1]}" if len(sizes) > 1 else str(sizes[0])
    return f"W = {listed} ({repeats} repeats), {counts['steps']} timed steps per fit"


def _pitfall(result: dict[str, Any]) -> str:
    return (
        f"at {result['world_size']} ranks, `{', '.join(result['errors'])}` on every rank, its first line"
        f" ({result['first_line_chars']} characters) the same on {result['ranks_with_that_first_line']} of"
        f" {result['world_size']}, {result['seconds_to_last_error']:.1f} s after rank 0 made the call"
    )


def _channel_page(channel: dict[str, Any]) -> str:
    """The channel's page, with the model on paper computed from its round time (the model's output, kept with it)."""
    return (
        channel_report.markdown(channel)
        + "\n## The model on paper, to 4,096 ranks (`benchmarks/channel/model.py`)\n\n"
        + f"Per step, between hosts: Python's time per round {round_us(channel):.0f} µs (measured above: the check's"
        + f" CPU time at 2 ranks), a TCP message {model.ALPHA_US:.0f} µs (gloo's README), NCCL's own latency model for"
        + " stock's calls; docs/hang-checks.md says where each parameter comes from. Not measured: no NCCL, no second"
        + " host here.\n"
        + _model_table(channel)
        + f"\n{_model_verdict(channel)}.\n"
    )


PAGES: dict[str, Callable[[dict[str, Any]], str]] = {  # each results file's Markdown page, written from its JSON
    "channel": _channel_page,
    "fits": fits_report.markdown,
    "pitfall": pitfall.markdown,
}

Figure = Callable[[dict[str, dict[str, Any] | None]], str]
FIGURES: dict[str, Figure] = {
    "channel-date": lambda r: _needed(r["channel"], "channel")["metadata"]["date"][:10],
    "channel-table": lambda r: _channel_table(_needed(r["channel"], "channel")),
    "channel-round": lambda r: f"{round_us(_needed(r['channel'], 'channel')):.0f} µs",
    "model-table": lambda r: _model_table(_needed(r["channel"], "channel")),
    "model-nccl": lambda r: _nccl_parameters(),
    "model-nccl-4096": lambda r: f"{model.nccl_allreduce_us(4096):.0f} µs",
    "model-alpha": lambda r: (
        f"{model.ALPHA_US:.0f} µs (gloo's README: its ring all-reduce of one element, 4 machines on 40GbE,"
        f" {model.GLOO_RING[0]:.0f} µs over {model.GLOO_RING[1]} messages)"
    ),
    "model-fast-alpha": lambda r: f"{model.FAST_ALPHA_US:.0f} µs",
    "model-verdict": lambda r: _model_verdict(_needed(r["channel"], "channel")),
    "fits-date": lambda r: _needed(r["fits"], "fits")["metadata"]["date"][:10],
    "fits-grid": lambda r: _grid(_needed(r["fits"], "fits")),
    "fits-set-up": lambda r: "\n" + fits_report.set_up_table(_needed(r["fits"], "fits")) + "\n",
    "fits-steps": lambda r: "\n" + fits_report.step_table(_needed(r["fits"], "fits")) + "\n",
    "fits-targets": lambda r: "\n" + fits_report.target_lines(_needed(r["fits"], "fits")) + "\n",
    "pitfall-32": lambda r: _pitfall(_needed(r["pitfall"], "fits.pitfall")),
    "pitfall-line": lambda r: f"`{_needed(r['pitfall'], 'fits.pitfall')['first_line']}`",
}
