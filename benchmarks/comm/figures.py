"""The figures the README and the docs quote, written from one results file (``--update-docs``) or checked against it.

A quoted figure sits between ``<!-- figure:NAME -->`` and ``<!-- /figure -->`` in a Markdown file; :data:`FIGURES`
says how each is written from the results. The results' own Markdown file is written again from their JSON as well.
"""

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from benchmarks.comm import scale_figures
from benchmarks.comm.report import Row, Target, markdown
from benchmarks.comm.row_cost import RecordCost, RowCost, Spread
from benchmarks.comm.stall_cost import StallCost
from benchmarks.comm.sync_cost import SyncCost
from benchmarks.synced import report as synced_report

__all__ = ["FIGURES", "RESULTS", "Results", "load", "main", "rendered", "stale"]

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "cpu-2core-x86_64.json"
SYNCED = "synced-{stem}.json"  # the synced-logging benchmark's results, beside RESULTS (python -m benchmarks.synced)
SCALE = "scale-{stem}.json"  # the scale benchmark's results, beside RESULTS (python -m benchmarks.scale)
QUOTING = ("README.md", "docs/*.md", "benchmarks/README.md")  # the files that may quote figures
BLOCK = re.compile(r"(<!-- figure:(?P<name>[a-z0-9-]+) -->)(?P<text>.*?)(<!-- /figure -->)", re.DOTALL)


@dataclass(frozen=True)
class Results:
    """One results file, read back into the benchmark's own types."""

    metadata: dict[str, Any]
    rows: list[Row]
    targets: list[Target]
    costs: list[RowCost]
    syncs: list[SyncCost]
    records: list[RecordCost]
    stalls: list[StallCost]
    synced: dict[str, Any] | None = None  # the synced-logging benchmark's results, where there are some
    scale: dict[str, Any] | None = None  # the scale benchmark's results, where there are some
    cluster: dict[str, dict[str, Any] | None] | None = None  # the checks' channel's, the launched fits', the pitfall's

    def row(self, subject: str, world_size: int = 2) -> Row:
        return next(row for row in self.rows if (row.subject, row.world_size) == (subject, world_size))

    def target(self, subject: str, name: str = "training step") -> Target:
        return next(t for t in self.targets if t.where.endswith(f" {subject}") and t.name.startswith(name))

    def markdown(self) -> str:
        """The results' Markdown file, as the benchmark writes it."""
        parts = (self.rows, self.targets, self.metadata, self.costs, self.syncs, self.records, self.stalls)
        return markdown(*parts)


def _typed(kind: type, data: dict[str, Any]) -> Any:
    """``kind`` from its JSON: ``{median, low, high}`` objects become :class:`Spread`, lists tuples."""

    def value(item: Any) -> Any:
        if isinstance(item, dict) and set(item) == {"median", "low", "high"}:
            return Spread(**item)
        if isinstance(item, dict):
            return {key: value(inner) for key, inner in item.items()}
        return tuple(item) if isinstance(item, list) else item

    names = {field.name for field in fields(kind)}
    return kind(**{key: value(item) for key, item in data.items() if key in names})


def _synced_path(path: Path) -> Path:
    return path.with_name(SYNCED.format(stem=path.stem))


def load(path: Path = RESULTS) -> Results:
    """The results file at ``path`` (its JSON), with the synced-logging and scale results beside it if there are
    some."""
    document = json.loads(path.read_text(encoding="utf-8"))
    synced, scale = _synced_path(path), path.with_name(SCALE.format(stem=path.stem))
    return Results(
        document["metadata"],
        [_typed(Row, row) for row in document["rows"]],
        [_typed(Target, target) for target in document["targets"]],
        [_typed(RowCost, cost) for cost in document["per_rank_cost"]],
        [_typed(SyncCost, cost) for cost in document["sync_point"]],
        [_typed(RecordCost, cost) for cost in document["record_cost"]],
        [_typed(StallCost, cost) for cost in document["stall_cost"]],
        json.loads(synced.read_text(encoding="utf-8")) if synced.exists() else None,
        json.loads(scale.read_text(encoding="utf-8")) if scale.exists() else None,
        {kind: _document(scale_figures.path_of(path, kind)) for kind in scale_figures.PAGES},
    )


def _document(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


# ---- the figures ---------------------------------------------------------------------------------------------------
def _us(value: float) -> str:
    return f"{value:.1f} µs" if value < 100 else f"{value:,.0f} µs"


def _ratio(row: Row) -> str:
    if row.ratio_interval is None:
        return f"{row.ratio_to_stock:.3f}"
    return f"{row.ratio_to_stock:.3f} ({row.ratio_interval[0]:.2f}-{row.ratio_interval[1]:.2f})"


def _span(values: list[float], form: str = "{:.2f}") -> str:
    low, high = form.format(min(values)), form.format(max(values))
    return low if low == high else f"{low}-{high}"


def _decisions(results: Results, world_size: int) -> list[Row]:
    return [row for row in results.rows if row.is_policy and row.world_size == world_size]


_STEP_ROWS = (  # the README's table: what, the subject, the target's words
    ("training step, stock against itself, 1 synced value (`stock_twin`)", "stock_twin", None),
    ("training step, `per_rank_metrics=True` (checks off)", "per_rank_metrics", "≤ {limit:.2f}"),
    ("training step, telemetry at every step, against the same run without it", "telemetry", "≤ {limit:.2f}"),
    ("training step, the stall report on, against the same run with it off", "stall_report", "within the twin's noise"),
    ("training step, default hang checks, 1 synced value", "hang_checks", "within the twin's noise (≤ {limit:.3f})"),
    ("training step, stock against itself, 5 synced values", "stock_5_synced_twin", None),
    (
        "training step, default hang checks, 5 synced values",
        "hang_checks_5_synced",
        "within the twin's noise (≤ {limit:.3f})",
    ),
)


def _benchmark_table(results: Results) -> str:
    decisions = [row for row in results.rows if row.is_policy]
    latency = [t for t in results.targets if t.name == "decision latency vs stock"]
    met = "met" if all(t.met for t in latency) else "**missed**"
    sizes = " and ".join(str(size) for size in sorted({row.world_size for row in decisions}))
    lines = [
        "| what | ratio to stock (95% interval) | target |",
        "|---|---:|---|",
        f"| a checkpoint or early-stopping decision, any policy, {sizes} ranks"
        f" | {_span([row.ratio_to_stock for row in decisions])} | ≤ {latency[0].limit:.2f}, {met} |",
    ]
    for what, subject, words in _STEP_ROWS:
        row = results.row(f"training_step/{subject}")
        if words is None:
            lines.append(f"| {what} | {_ratio(row)} | (noise) |")
            continue
        target = results.target(f"training_step/{subject}")
        lines.append(f"| {what} | {_ratio(row)} | {words.format(limit=target.limit)}, {target.verdict()} |")
    return "\n" + "\n".join(lines) + "\n"


def _decision_costs(results: Results) -> str:
    parts = []
    for size in sorted({row.world_size for row in results.rows if row.is_policy}):
        policies = _decisions(results, size)
        stock = [results.row(f"{path}/stock", size).median_us for path in ("checkpoint", "early_stopping")]
        parts.append(
            f"at {size} ranks a policy decision's median was {_span([row.ratio_to_stock for row in policies])}x"
            f" stock's ({_span([row.median_us for row in policies], '{:,.0f}')} µs against"
            f" {_span(stock, '{:,.0f}')} µs), each rank receiving {policies[0].received_bytes:g} bytes"
        )
    records = "; ".join(
        f"{cost.session}: {_us(cost.cpu_us.median)} (90th percentile {_us(cost.p90_us)}, median over {cost.rows:,})"
        for cost in results.records
    )
    return f"{'; '.join(parts)}. One record row cost rank 0, in CPU time, {records}"


def _hang_checks_table(results: Results) -> str:
    def cell(subject: str) -> str:
        row, cpu = results.row(f"training_step/{subject}"), results.row(f"training_step_cpu/{subject}")
        low, high = row.ratio_interval or (row.ratio_to_stock, row.ratio_to_stock)
        return f"{row.ratio_to_stock:.3f}, {low:.2f}-{high:.2f} ({cpu.ratio_to_stock:.3f})"

    extra = results.syncs[0].extra_us
    lines = [
        "| configuration | 1 synced value per step | 5 synced values per step |",
        "|---|---:|---:|",
        f"| stock against itself (`stock_twin`) | {cell('stock_twin')} | {cell('stock_5_synced_twin')} |",
        f"| default checks | {cell('hang_checks')} | {cell('hang_checks_5_synced')} |",
        f'| `hang_checks="debug"` | {cell("hang_checks_debug")} | |',
        "| time in the checks against stock's barriers alone, per synced value (paired"
        " fit by fit) |"
        f" {extra['hang_checks'].median:+.0f} µs | {extra['hang_checks_5_synced'].median:+.0f} µs |",
    ]
    return "\n" + "\n".join(lines) + "\n"


def _cost(results: Results) -> RowCost:
    return results.costs[0]


def _measured(results: Results, name: str) -> Spread:
    """A telemetry figure of the per-rank cost (``sample_cpu_us``, ``memory_cpu_us``): the run must have it."""
    spread: Spread | None = getattr(_cost(results), name)
    if spread is None:
        raise ValueError(f"the results file has no {name}: it comes from a run without telemetry")
    return spread


def _synced(results: Results) -> dict[str, Any]:
    if results.synced is None:
        raise ValueError("there are no synced-logging results beside the results file (python -m benchmarks.synced)")
    return results.synced


def _synced_ratios(results: Results) -> str:
    """``at 2 ranks 0.91x, 0.52x, 0.31x stock's step with 1, 5, 20 synced values; at 4 ranks ...``."""
    rows = [row for row in _synced(results)["rows"] if row["config"] == "defaults"]
    parts = []
    for size in sorted({row["world_size"] for row in rows}):
        mine = sorted((row for row in rows if row["world_size"] == size), key=lambda row: row["values"])
        ratios = ", ".join(f"{row['ratio']['median']:.2f}x" for row in mine)
        values = ", ".join(str(row["values"]) for row in mine)
        parts.append(f"at {size} ranks {ratios} stock's step time with {values} synced values per step")
    return "; ".join(parts)


def _cluster(figure: scale_figures.Figure) -> Callable[[Results], str]:
    """A figure of the checks' channel at scale, read from the results' :attr:`Results.cluster`."""
    return lambda results: figure(results.cluster or {})


def _scale(results: Results) -> dict[str, Any]:
    if results.scale is None:
        raise ValueError("there are no scale results beside the results file (python -m benchmarks.scale)")
    return results.scale


def _writer_walls(results: Results) -> str:
    """``2.59 µs at 1 writer, 2.66 µs at 2, ... and 27.0 µs at 16``: wall time per row by concurrent writers."""
    parts = [f"{run['row_wall_us']:#.3g} µs at {run['writers']}" for run in _scale(results)["writer"]]
    parts[0] += " writer" if _scale(results)["writer"][0]["writers"] == 1 else " writers"
    return ", ".join(parts[:-1]) + f" and {parts[-1]}"


def _writer_peak(results: Results) -> str:
    peak = max(_scale(results)["writer"], key=lambda run: run["rows_per_s_all"])
    return f"{peak['rows_per_s_all']:,.0f} rows/s with {peak['writers']}"


def _largest_read(results: Results) -> dict[str, Any]:
    return max(_scale(results)["reader"], key=lambda run: run["ranks"])


def _read_memory(results: Results) -> str:
    largest = _largest_read(results)
    ours, plain = (largest["memory"][name]["ratio"] for name in ("read_rank_metrics", "plain pandas loop"))
    return f"{ours:.2f}x at {largest['ranks']:,} ranks, against {plain:.2f}x"


def _summary_size(results: Results) -> str:
    largest = max(_scale(results)["summary"], key=lambda run: run["ranks"])
    return f"{largest['text_lines']} lines, {largest['text_bytes'] / 1000:.1f} kB"


def _checks_verdict(results: Results) -> str:
    """Whether the default hang checks stay within stock's noise with 1 and with 5 synced values, from both targets."""
    targets = [results.target(f"training_step/{subject}") for subject in ("hang_checks", "hang_checks_5_synced")]
    word = "met" if all(target.met for target in targets) else "**missed**"
    under = all(target.interval is not None and target.interval[1] <= target.limit for target in targets)
    how = (
        "the whole interval under the twin's bound in both"
        if under
        else "; ".join(f"{n} synced value(s): {t.verdict()}" for n, t in zip((1, 5), targets, strict=True))
    )
    return f"The target (within stock's noise, with 1 and with 5 synced values) is {word}, {how}"


FIGURES: dict[str, Callable[[Results], str]] = {
    "date": lambda results: results.metadata["date"][:10],
    "repeats": lambda results: str(results.metadata["counts"]["repeats"]),
    "stock-step": lambda results: f"{results.row('training_step/stock').median_us / 1000:.1f} ms",
    "benchmark-table": _benchmark_table,
    "row-cpu": lambda results: _us(_cost(results).row_cpu_us.median),
    "sample-cpu": lambda results: _us(_measured(results, "sample_cpu_us").median),
    "sample-share": lambda r: f"{_measured(r, 'sample_cpu_us').median / _cost(r).per_rank_step_us:.2%}",
    "memory-cpu": lambda results: _us(_measured(results, "memory_cpu_us").median),
    "memory-cpu-range": lambda r: (
        f"{_measured(r, 'memory_cpu_us').low:.0f}-{_measured(r, 'memory_cpu_us').high:.0f} µs"
    ),
    "telemetry-step": lambda results: f"{_cost(results).per_rank_step_us / 1000:.1f} ms",
    "stall-cpu": lambda results: _us(results.stalls[0].cpu_us.median),
    "stall-share": lambda results: f"{results.stalls[0].cpu_us.median / results.stalls[0].step_us:.2%}",
    "stall-step": lambda results: f"{results.stalls[0].step_us / 1000:.1f} ms",
    "record-cpu": lambda results: f"{_span([cost.cpu_us.median for cost in results.records], '{:.0f}')} µs",
    "decision-costs": _decision_costs,
    "sync-1": lambda r: _signed(r.syncs[0].extra_us["hang_checks"].median),
    "sync-5": lambda r: _signed(r.syncs[0].extra_us["hang_checks_5_synced"].median),
    "cpu-5": lambda r: _more_or_less(r.row("training_step_cpu/hang_checks_5_synced").ratio_to_stock - 1),
    "step-5": lambda r: f"{r.row('training_step/stock_5_synced').median_us / 1000:.0f} ms",
    "hang-checks-table": _hang_checks_table,
    "tensorboard-step": lambda r: _ratio(r.row("training_step/tensorboard")),
    "csv-step": lambda r: _ratio(r.row("training_step/per_rank_metrics")),
    "mlflow-step": lambda r: _ratio(r.row("training_step/mlflow")),
    "wandb-step": lambda r: _ratio(r.row("training_step/wandb")),
    "twin-step": lambda r: _ratio(r.row("training_step/stock_twin")),
    "mlflow-row-cpu": lambda results: _us(_cost(results).sink_row_cpu_us["mlflow"].median),
    "wandb-row-cpu": lambda results: _us(_cost(results).sink_row_cpu_us["wandb"].median),
    "events-row-cpu": lambda results: _us(_measured(results, "events_row_cpu_us").median),
    "events-row-thread-cpu": lambda results: _us(_measured(results, "events_row_thread_cpu_us").median),
    "synced-date": lambda results: _synced(results)["metadata"]["date"][:10],
    "synced-ratios": _synced_ratios,
    "synced-table": lambda results: "\n" + synced_report.table(_synced(results)) + "\n",
    "synced-targets": lambda results: "\n" + synced_report.target_lines(_synced(results)) + "\n",
    "checks-verdict": _checks_verdict,
    "scale-writer-rows": lambda results: f"{_scale(results)['writer_rows']:,}",
    "scale-writer-cpu": lambda r: f"{_span([run['row_cpu_us'] for run in _scale(r)['writer']], '{:.1f}')} µs",
    "scale-writer-walls": _writer_walls,
    "scale-writer-peak": _writer_peak,
    "scale-read-size": lambda r: f"{_largest_read(r)['ranks']:,} ranks x {_scale(r)['rows']:,} rows",
    "scale-read-time": lambda r: f"{_largest_read(r)['ratio']['read_rank_metrics']:.2f}x",
    "scale-read-memory": _read_memory,
    "scale-summary-size": _summary_size,
    "scale-start": lambda results: f"{_scale(results)['start']['median_help_s']:.2f} s",
    **{name: _cluster(figure) for name, figure in scale_figures.FIGURES.items()},
}


def _more_or_less(share: float) -> str:
    """``27% less`` or ``8% more``: a ratio's distance from 1."""
    return f"{abs(share):.0%} {'less' if share < 0 else 'more'}"


def _signed(micros: float) -> str:
    return f"{abs(micros):.0f} µs {'less' if micros < 0 else 'more'}"


# ---- the files -----------------------------------------------------------------------------------------------------
def quoting(repo: Path = REPO) -> Iterator[Path]:
    """The Markdown files that may quote figures."""
    for pattern in QUOTING:
        yield from sorted(repo.glob(pattern))


def rendered(text: str, results: Results) -> str:
    """``text`` with every figure block written from ``results``; an unknown figure name raises ``KeyError``."""
    return BLOCK.sub(lambda m: m.group(1) + FIGURES[m.group("name")](results) + m.group(4), text)


def stale(repo: Path = REPO, results_path: Path = RESULTS) -> list[Path]:
    """The files whose figures (or, for the results' Markdown file, whose content) disagree with the results."""
    results = load(results_path)
    found = [path for path in quoting(repo) if rendered(path.read_text("utf-8"), results) != path.read_text("utf-8")]
    page = results_path.with_suffix(".md")
    found += [page] if page.read_text("utf-8") != results.markdown() else []
    synced = _synced_path(results_path).with_suffix(".md")
    if results.synced is not None and synced.read_text("utf-8") != synced_report.markdown(results.synced):
        found.append(synced)
    for kind, document in (results.cluster or {}).items():
        page = scale_figures.path_of(results_path, kind).with_suffix(".md")
        if document is not None and page.read_text("utf-8") != scale_figures.PAGES[kind](document):
            found.append(page)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.comm.figures", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results file (its JSON)")
    parser.add_argument("--update-docs", action="store_true", help="write the figures; else only say what differs")
    args = parser.parse_args(argv)
    results, paths, page = load(args.results), stale(REPO, args.results), args.results.with_suffix(".md")
    for path in paths:
        if args.update_docs:
            if path == page:
                text = results.markdown()
            elif results.synced is not None and path == _synced_path(args.results).with_suffix(".md"):
                text = synced_report.markdown(results.synced)
            elif path.name.split("-")[0] in scale_figures.PAGES and path.suffix == ".md" and path.parent == page.parent:
                kind = path.name.split("-")[0]
                text = scale_figures.PAGES[kind](_document(scale_figures.path_of(args.results, kind)) or {})
            else:
                text = rendered(path.read_text("utf-8"), results)
            path.write_text(text, encoding="utf-8")
        print(f"{'wrote' if args.update_docs else 'differs from the results'}: {path.relative_to(REPO)}")
    return 0 if args.update_docs or not paths else 1


if __name__ == "__main__":
    sys.exit(main())
