"""The scale benchmark's results as Markdown and as a chart (reader time, peak memory, summary, writer cost)."""

import statistics
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["spread", "write_chart", "write_markdown"]


def spread(values: list[float]) -> dict[str, float]:
    """Median, lowest and highest of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _seconds(figure: dict[str, float]) -> str:
    return f"{figure['median']:.3f} ({figure['min']:.3f}-{figure['max']:.3f})"


def _span(figure: dict[str, float]) -> str:
    return f"{figure['min']:.2f}-{figure['max']:.2f}"


def write_markdown(path: Path, document: dict[str, Any]) -> None:
    """The results as Markdown tables, with the method and the machine's load."""
    meta = document["metadata"]
    lines = [
        f"# Per-rank metrics at scale: {meta['machine']}",
        "",
        f"`{meta['command']}` on {meta['date']}; Python {meta['python']}, pandas {meta['pandas']}, pyarrow"
        f" {meta['pyarrow']}, numpy {meta['numpy']}; {meta['cpu_count']} CPU(s). Load average (1, 5, 15 min)"
        f" before: {meta['load_average_before']}, after: {meta['load_average_after']} (a shared machine: other"
        " work ran at the same time, so the ratios, taken within each repeat, matter more than the seconds).",
        "",
        "## Reading: `read_rank_metrics` against a plain `pandas.read_csv` loop",
        "",
        f"Each rank: {document['rows']} rows x 4 metrics (+ `epoch`, `step`). Seconds: median (lowest-highest) of"
        f" {document['repeats']} interleaved reads; ratio: the median (lowest-highest) of the per-repeat wall-time"
        " ratios to the plain loop; CPU ratio: the median of the same for the process's CPU time.",
        "",
        "| ranks | rows | plain loop (s) | read_rank_metrics (s) | ratio | pandas engine (s) | ratio | CPU ratio |"
        " same values | peak memory / frame |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in document["reader"]:
        memory = row["memory"]["read_rank_metrics"]
        lines.append(
            f"| {row['ranks']} | {row['table_rows']} | {_seconds(row['wall_s']['plain pandas loop'])} |"
            f" {_seconds(row['wall_s']['read_rank_metrics'])} | **{row['ratio']['read_rank_metrics']:.2f}**"
            f" ({_span(row['ratio_spread']['read_rank_metrics'])}) |"
            f" {_seconds(row['wall_s']['read_rank_metrics (pandas engine)'])} |"
            f" {row['ratio']['read_rank_metrics (pandas engine)']:.2f} | {row['cpu_ratio']:.2f} |"
            f" {'yes' if row['same_values'] else '**no**'} | **{memory['ratio']:.2f}**"
            f" ({memory['peak_bytes'] / 1e6:.0f} MB / {memory['frame_bytes'] / 1e6:.0f} MB) |"
        )
    lines += [
        "",
        "Peak memory of the other readers, same measure (peak resident size during the read less the size before,"
        " over the frame): "
        + "; ".join(
            f"{row['ranks']} ranks: plain loop {row['memory']['plain pandas loop']['ratio']:.2f}, pandas engine"
            f" {row['memory']['read_rank_metrics (pandas engine)']['ratio']:.2f}"
            for row in document["reader"]
        )
        + ".",
        "",
        "## Summary: `lightning-ext ranks LOG_DIR`, a fresh process each time",
        "",
        "| ranks | wall (s) | text output | JSON output |",
        "|---|---|---|---|",
    ]
    for row in document["summary"]:
        lines.append(
            f"| {row['ranks']} | {_seconds(row['wall'])} | {row['text_bytes']} bytes, {row['text_lines']} lines |"
            f" {row['json_bytes']} bytes |"
        )
    start = document["start"]
    lines += [
        "",
        f"Start: `lightning-ext ranks --help` takes {start['median_help_s']:.3f} s (median of"
        f" {len(start['help_wall_s'])}), `python -c pass` {start['median_python_s']:.3f} s; modules of torch,"
        f" Lightning or matplotlib imported: {start['heavy_imports'] or 'none'}.",
        "",
        f"The summary printed at {document['summary'][-1]['ranks']} ranks:",
        "",
        "```",
        document["summary"][-1]["text"].rstrip(),
        "```",
        "",
        *_straggler_lines(document),
        "## Writing: a row's cost as concurrent writers grow",
        "",
        f"Each writer process logs {document['writer_rows']} rows (4 metrics + `epoch`) to its own file,"
        f" `flush_every_n_rows=100`, then closes it; all start together. Median of {document['repeats']} rounds.",
        "",
        "| writers | wall per row (us) | slowest writer (us/row) | CPU per row (us) | rows/s, all writers |",
        "|---|---|---|---|---|",
    ]
    for row in document["writer"]:
        lines.append(
            f"| {row['writers']} | {row['row_wall_us']:.2f} | {row['row_wall_us_slowest']:.2f} |"
            f" {row['row_cpu_us']:.2f} | {row['rows_per_s_all']:.0f} |"
        )
    lines += ["", "## File-system work per phase of one writer (counted calls)", ""]
    for where, phases in document["file_system_work"].items():
        names = sorted({name for counts in phases.values() for name in counts})
        lines += [f"**{where}**", "", "| phase | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for phase, counts in phases.items():
            lines.append(f"| {phase} | " + " | ".join(str(counts.get(name, 0)) for name in names) + " |")
        lines.append("")
    lines += ["## Method", "", *[f"- {note}" for note in meta["notes"]], ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def _straggler_lines(document: dict[str, Any]) -> list[str]:
    rows = document.get("stragglers", [])
    if not rows:
        return []
    lines = [
        "## The straggler verdict: `lightning-ext ranks LOG_DIR --stragglers`, a fresh process each time",
        "",
        f"Simulated telemetry: a row every 50 of the {document['rows']} steps per rank, 8 ranks per host (host"
        " records), one rank 20 ms per batch slower in data loading and one 15 ms slower in forward, 3% noise"
        " elsewhere.",
        "",
        "| ranks | wall (s) | text output | named (rank, phase) | planted |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['ranks']} | {_seconds(row['wall'])} | {row['text_bytes']} bytes, {row['text_lines']} lines |"
            f" {row['found']} | {row['planted']} |"
        )
    text = rows[-1]["text"].rstrip().splitlines()
    return [*lines, "", f"The verdict printed at {rows[-1]['ranks']} ranks:", "", "```", *text, "```", ""]


def write_chart(path: Path, document: dict[str, Any]) -> None:
    """Four panels: reader seconds, peak memory ratio, summary seconds, writer microseconds per row."""
    figure = Figure(figsize=(14, 9), layout="constrained")
    FigureCanvasAgg(figure)
    (read, memory), (summary, writer) = figure.subplots(2, 2)
    ranks = [row["ranks"] for row in document["reader"]]
    for name, style in (
        ("plain pandas loop", "o-"),
        ("read_rank_metrics", "s-"),
        ("read_rank_metrics (pandas engine)", "^--"),
    ):
        medians = [row["wall_s"][name]["median"] for row in document["reader"]]
        lows = [row["wall_s"][name]["median"] - row["wall_s"][name]["min"] for row in document["reader"]]
        highs = [row["wall_s"][name]["max"] - row["wall_s"][name]["median"] for row in document["reader"]]
        read.errorbar(ranks, medians, yerr=[lows, highs], fmt=style, capsize=3, label=name)
    read.set(xscale="log", yscale="log", xlabel="ranks", ylabel="seconds (median, lowest-highest)")
    read.set_title(f"Reading {document['rows']} rows x 4 metrics per rank")
    read.set_xticks(ranks, [str(r) for r in ranks])
    read.legend()
    read.grid(alpha=0.3)
    for name, style in (
        ("plain pandas loop", "o-"),
        ("read_rank_metrics", "s-"),
        ("read_rank_metrics (pandas engine)", "^--"),
    ):
        memory.plot(ranks, [row["memory"][name]["ratio"] for row in document["reader"]], style, label=name)
    memory.axhline(2.0, color="crimson", linestyle="--", linewidth=1, label="target: 2x the frame")
    memory.set(xscale="log", xlabel="ranks", ylabel="peak memory growth / frame size")
    memory.set_xticks(ranks, [str(r) for r in ranks])
    memory.set_title("Peak memory of one read, over the frame it returns")
    memory.legend()
    memory.grid(alpha=0.3)
    sizes = [row["ranks"] for row in document["summary"]]
    summary.plot(sizes, [row["wall"]["median"] for row in document["summary"]], "s-", label="lightning-ext ranks (s)")
    summary.set(xscale="log", xlabel="ranks", ylabel="seconds")
    summary.set_xticks(sizes, [str(r) for r in sizes])
    twin = summary.twinx()
    twin.plot(sizes, [row["text_bytes"] for row in document["summary"]], "o:", color="tab:orange", label="text bytes")
    twin.set_ylabel("bytes printed (text)")
    twin.set_ylim(bottom=0)
    summary.set_title("lightning-ext ranks: time, and output size")
    summary.legend(loc="upper left")
    twin.legend(loc="lower right")
    summary.grid(alpha=0.3)
    counts = [row["writers"] for row in document["writer"]]
    writer.plot(counts, [row["row_wall_us"] for row in document["writer"]], "s-", label="wall per row (median writer)")
    writer.plot(counts, [row["row_wall_us_slowest"] for row in document["writer"]], "v:", label="slowest writer")
    writer.plot(counts, [row["row_cpu_us"] for row in document["writer"]], "o--", label="CPU per row")
    writer.set(xscale="log", xlabel="concurrent writer processes", ylabel="microseconds per row")
    writer.set_xticks(counts, [str(c) for c in counts])
    writer.set_title(f"RankMetricsWriter, {document['metadata']['cpu_count']} CPU(s)")
    writer.legend()
    writer.grid(alpha=0.3)
    figure.suptitle(f"Per-rank metrics at scale ({document['metadata']['machine']})")
    figure.savefig(path, dpi=100)
