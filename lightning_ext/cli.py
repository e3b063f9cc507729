"""The ``lightning-ext`` command line (also ``python -m lightning_ext``); it imports neither Lightning nor torch."""

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lightning_ext._decisions.record_format import COLUMNS, changed_something, json_row
from lightning_ext._files.csv_format import GRADIENT_WAIT_S, RSS_BYTES, STEP_S, TELEMETRY_COLUMNS
from lightning_ext._rank_lists import ranks_text
from lightning_ext._reading.reader import ReadReport, Request, read_table
from lightning_ext._summaries.number_format import csv_text, json_value
from lightning_ext._summaries.spread import OUTLIER_MARK, ROBUST_Z, MetricSpread
from lightning_ext._summaries.spread_format import furthest_table, spread_records, spreads_csv, stats_table
from lightning_ext._summaries.straggler_format import (
    RULE,
    memory_lines,
    stragglers_csv,
    stragglers_records,
    stragglers_text,
)
from lightning_ext._summaries.stragglers import phase_medians
from lightning_ext.check import command as check
from lightning_ext.decision_record import read_record
from lightning_ext.rank_metrics import DEFAULT_FILENAME, read_rank_hosts
from lightning_ext.rank_spread import (
    find_stragglers,
    format_spread,
    host_memory,
    plot_rank_curves,
    summarize_ranks,
    summarize_spread,
)

__all__ = ["main"]

_PROG = "lightning-ext"
_PLOT_HINT = "pip install 'lightning-ext[plot]'"
SIDE_BY_SIDE = 8  # ranks shown side by side; more get the summary at scale


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code (usage errors exit with code 2 through argparse).

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` if ``None``.

    Example:
        >>> main(["ranks", "/no/such/dir"])
        1

    """
    args = _parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=_PROG, description="Tools for PyTorch Lightning runs under DDP.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ranks = commands.add_parser(
        "ranks",
        help="how far the ranks' metrics drift apart",
        description="For each metric, each rank's last value (or its value at --step) across ranks: side by side up"
        f" to {SIDE_BY_SIDE} ranks; beyond, min / median / max / spread and the ranks furthest from the median"
        f" ({ROBUST_Z}).",
    )
    ranks.add_argument(
        "log_dir", metavar="LOG_DIR", help="the directory that holds rank_<r>/metrics.csv (a path or an fsspec URL)"
    )
    ranks.add_argument(
        "--metric",
        dest="metrics",
        metavar="NAME",
        action="extend",
        nargs="+",
        help="only these metrics (repeat the option or list several names); default: all",
    )
    ranks.add_argument(
        "--step", type=_step, default="last", help="whose value: 'last' (each rank's last value, the default) or a step"
    )
    ranks.add_argument("--top", type=_count, default=5, metavar="N", help="ranks named per metric (default: 5)")
    ranks.add_argument("--format", choices=("text", "json", "csv"), default="text", help="output (default: text)")
    ranks.add_argument("--ranks", type=_ranks, metavar="SPEC", help="only these ranks, e.g. 0-511,600 (default: all)")
    ranks.add_argument("--plot", metavar="FILE.png", type=Path, help=f"also draw the ranks' curves ({_PLOT_HINT})")
    ranks.add_argument(
        "--filename",
        default=DEFAULT_FILENAME,
        metavar="TEMPLATE",
        help=f"each rank's file, relative to LOG_DIR, with {{rank}} for the rank (default: {DEFAULT_FILENAME})",
    )
    ranks.add_argument("--allow-mixed", action="store_true", help="read files of more than one run instead of refusing")
    ranks.add_argument(
        "--stragglers",
        action="store_true",
        help="instead, the verdict from per-rank telemetry: the ranks the others wait for, in which phase their extra"
        " time goes (data loading, forward, backward compute, optimizer, hooks and logging), whether all along or in"
        " bursts (which steps), what it costs the others; and each host's memory",
    )
    ranks.set_defaults(run=_run_ranks)
    decisions = commands.add_parser(
        "decisions",
        help="why each checkpoint was (not) saved, and why training stopped",
        description="The story of a run from its decision record (decisions.csv, written by rank 0): one line per"
        " ModelCheckpoint or EarlyStopping decision, with the reason.",
    )
    decisions.add_argument(
        "log_dir",
        metavar="LOG_DIR",
        help="the run's log directory, which holds decisions.csv (a path or an fsspec URL)",
    )
    decisions.add_argument("--callback", metavar="NAME", help="only this callback class, e.g. EarlyStopping")
    decisions.add_argument(
        "--only-changes", action="store_true", help="only decisions that changed something: a save, a stop, a new best"
    )
    decisions.add_argument("--format", choices=("text", "json", "csv"), default="text", help="output (default: text)")
    decisions.add_argument("--run", dest="run_id", metavar="ID", help="only this run's decisions (the run column)")
    decisions.add_argument(
        "--allow-mixed", action="store_true", help="read a record of several runs instead of refusing"
    )
    decisions.set_defaults(run=_run_decisions)
    check.add_arguments(commands.add_parser("check", help=check.HELP, description=check.DESCRIPTION))
    return parser


def _step(text: str) -> int | str:
    if text == "last":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'last' or a step (a whole number), got {text!r}") from None


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _ranks(text: str) -> list[int]:
    chosen: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or (last and int(last) < int(first)):
            raise argparse.ArgumentTypeError(f"expected ranks such as 0-511,600, got {text!r}")
        chosen.update(range(int(first), int(last or first) + 1))
    return sorted(chosen)


def _run_ranks(args: argparse.Namespace) -> int:
    if args.plot is not None:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            print(f"{_PROG} ranks: --plot needs matplotlib: {_PLOT_HINT}", file=sys.stderr)
            return 2
    step = args.step
    # only the rows at that step, unless the plot needs every row
    at = step if isinstance(step, int) and args.plot is None else None
    how = {"skip_bad_files": True, "allow_mixed": args.allow_mixed, "engine": None}
    if args.stragglers:  # the telemetry columns only, and all their rows
        request = Request.checked(TELEMETRY_COLUMNS, args.ranks, **how, present_only=True)
    else:
        request = Request.checked(args.metrics, args.ranks, at, at, **how)
    report = ReadReport()
    try:
        try:
            table = read_table(args.log_dir, args.filename, request, report)
        finally:
            for kind, note in report.notes:
                if kind != "skipped" or args.format == "csv":  # text and JSON list the skipped files themselves
                    print(f"{_PROG} ranks: warning: {note}", file=sys.stderr)
        if not report.ranks:
            raise ValueError(f"No rank's file could be read under {args.log_dir}")
        memory = _memory(args, table)
        if args.stragglers:
            _print_stragglers(args, table, report, memory)
        else:
            _print_summary(args, table, report, memory)
        if args.plot is not None:
            plot_rank_curves(table, args.plot, metrics=args.metrics, top=args.top)
            print(f"wrote {args.plot}", file=sys.stderr if args.format != "text" else sys.stdout)
    except BrokenPipeError:  # `| head` closed the pipe: stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's final flush goes nowhere
        return 1
    except (OSError, ValueError) as error:  # FileNotFoundError, RankMetricsError, an unknown metric
        print(f"{_PROG} ranks: error: {error}", file=sys.stderr)
        return 1
    return 0


def _memory(args: argparse.Namespace, table: pd.DataFrame) -> pd.DataFrame | None:
    """Each host's memory check, where the files hold telemetry and the ranks' host records are there."""
    if RSS_BYTES not in table.columns:
        return None
    hosts = read_rank_hosts(args.log_dir, filename=args.filename)
    hosts = hosts[hosts.index.isin(table["rank"].unique())]
    return host_memory(table, hosts) if len(hosts) else None


def _print_summary(args: argparse.Namespace, table: pd.DataFrame, report: ReadReport, memory: Any) -> None:
    many = table["rank"].nunique() > SIDE_BY_SIDE
    spreads = summarize_ranks(table, metrics=args.metrics, step=args.step, top=args.top)
    warnings = memory_lines(memory) if memory is not None else []
    if args.format == "json":
        document = _document(args, table, spreads, report)
        if memory is not None:
            document["memory"] = _memory_records(memory)
        print(json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False))
    elif args.format == "csv":
        print(spreads_csv(spreads, top=args.top), end="")
        for line in warnings:
            print(f"{_PROG} ranks: warning: {line}", file=sys.stderr)
    else:
        _print_text(args, table, spreads, report, many)
        for line in warnings:
            print(line)


def _print_stragglers(args: argparse.Namespace, table: pd.DataFrame, report: ReadReport, memory: Any) -> None:
    found = find_stragglers(table)  # a ValueError without telemetry
    hosts = read_rank_hosts(args.log_dir, filename=args.filename)
    samples = int(table[table[STEP_S].notna()].groupby("rank").size().median())
    medians = phase_medians(table)
    measured = GRADIENT_WAIT_S in table.columns
    if args.format == "json":
        document: dict[str, object] = {
            "log_dir": args.log_dir,
            "ranks": int(table["rank"].nunique()),
            "samples_per_rank": samples,
            "rule": RULE,
            "waits_measured": measured,
            "median_rank": {phase: json_value(seconds) for phase, seconds in medians.items()},
            "stragglers": stragglers_records(found, hosts),
            "memory": [] if memory is None else _memory_records(memory),
            "incomplete": [{"rank": rank, "detail": why} for rank, why in sorted(report.incomplete.items())],
        }
        for note in _notes(report):
            document[note.key] = [{"rank": rank, "detail": detail} for rank, detail in note.entries]
        print(json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False))
        return
    if args.format == "csv":
        print(stragglers_csv(found, hosts), end="")
        return
    ranks = table["rank"].nunique()
    print(
        f"{args.log_dir}: {ranks} rank(s) with telemetry, {samples} telemetry row(s) per rank (median; the first, the"
        " warm-up, is left out)"
    )
    for line in stragglers_text(found, medians, hosts, top=args.top, waits_measured=measured):
        print(line)
    for line in memory_lines(memory, most_loaded=True) if memory is not None else []:
        print(line)
    _print_notes(args, report)


def _memory_records(memory: pd.DataFrame) -> list[dict[str, object]]:
    return [{key: json_value(value) for key, value in record.items()} for record in memory.to_dict("records")]


def _print_text(
    args: argparse.Namespace, table: pd.DataFrame, spreads: list[MetricSpread], report: ReadReport, many: bool
) -> None:
    ranks = table["rank"].nunique()
    incomplete = f", incomplete: {ranks_text(report.incomplete, None)}" if report.incomplete else ""
    skipped = f", skipped: {ranks_text(report.skipped, None)}" if report.skipped else ""
    print(f"{args.log_dir}: {ranks} rank(s), {len(table)} row(s), {len(spreads)} metric(s){incomplete}{skipped}")
    value = "each rank's last value" if args.step == "last" else f"each rank's value at step {args.step}"
    if many:
        print(f"{value}; {ROBUST_Z}; {OUTLIER_MARK}")
        if spreads:
            print(stats_table(spreads))
            furthest = furthest_table(spreads)
            if furthest:
                print(f"furthest from the median (at most {args.top} per metric):")
                print(furthest)
    else:
        if args.step != "last":
            print(value)
        if spreads:
            print(format_spread(summarize_spread(table, metrics=args.metrics, step=args.step)))
    _print_notes(args, report)


def _print_notes(args: argparse.Namespace, report: ReadReport) -> None:
    for note in _notes(report):
        listed = [f"rank {rank} ({detail})" for rank, detail in note.entries]
        more = f"; and {len(listed) - args.top} more (--format json lists them all)" if len(listed) > args.top else ""
        print(f"{note.title}: {'; '.join(listed[: args.top])}{more}")


@dataclass(frozen=True)
class _Note:
    """Ranks the summary leaves out, or that it should be read with: a JSON key, a heading, ``(rank, detail)``."""

    key: str
    title: str
    entries: list[tuple[int, str]]


def _notes(report: ReadReport) -> list[_Note]:
    notes = [
        _Note("skipped", "skipped", sorted(report.skipped.items())),
        _Note("missing", "missing", [(rank, "no file") for rank in report.missing]),
        _Note(
            "without_rows",
            "without rows",
            [
                (rank, "header only" if info.has_header else "empty file")
                for rank, info in report.ranks.items()
                if not info.rows
            ],
        ),
    ]
    lasts = {rank: info.last_step for rank, info in report.ranks.items() if info.last_step is not None}
    end = max(lasts.values(), default=0)
    behind = sorted((step, rank) for rank, step in lasts.items() if step < end)
    notes.append(
        _Note("behind", f"behind (the other ranks reach step {end})", [(r, f"last step {s}") for s, r in behind])
    )
    earlier = [(rank, ", ".join(paths)) for rank, paths in sorted(report.rotated.items()) if paths]
    notes.append(_Note("earlier_runs", "earlier runs' files (ignored)", earlier))
    return [note for note in notes if note.entries]


def _document(
    args: argparse.Namespace, table: pd.DataFrame, spreads: list[MetricSpread], report: ReadReport
) -> dict[str, object]:
    return {
        "log_dir": args.log_dir,
        "ranks": int(table["rank"].nunique()),
        "rows": len(table),
        "value": args.step,
        "robust_z": ROBUST_Z,
        "metrics": spread_records(spreads),
        "incomplete": [{"rank": rank, "detail": why} for rank, why in sorted(report.incomplete.items())],
        **{note.key: [{"rank": rank, "detail": detail} for rank, detail in note.entries] for note in _notes(report)},
    }


def _run_decisions(args: argparse.Namespace) -> int:
    try:
        record = read_record(args.log_dir, run=args.run_id, allow_mixed=args.allow_mixed)
        for note in record.notes:
            print(f"{_PROG} decisions: warning: {note}", file=sys.stderr)
        chosen = [index for index, row in enumerate(record.rows) if _selected(row, args)]
        rows = [record.rows[index] for index in chosen]
        if args.format == "json":
            print(json.dumps([json_row(row) for row in rows], indent=1, ensure_ascii=False, allow_nan=False))
        elif args.format == "csv":
            cells = ([record.cells[index][name] for name in COLUMNS] for index in chosen)  # as the file has them
            print(csv_text(COLUMNS, cells), end="")
        else:
            _print_story(args.log_dir, record, rows)
    except BrokenPipeError:  # `| head` closed the pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (OSError, ValueError) as error:  # FileNotFoundError, DecisionRecordError, an unknown run
        print(f"{_PROG} decisions: error: {error}", file=sys.stderr)
        return 1
    return 0


def _selected(row: dict[str, Any], args: argparse.Namespace) -> bool:
    if args.callback is not None and row["callback"].lower() != args.callback.lower():
        return False
    return not args.only_changes or changed_something(row)


def _print_story(log_dir: str, record: Any, rows: list[dict[str, Any]]) -> None:
    worlds = "/".join(str(world) for world in sorted({row["world_size"] for row in record.rows})) or "0"
    runs = ", ".join(record.runs) or "none"
    print(f"{log_dir}: {len(rows)} decision(s) of {len(record.rows)}, {worlds} rank(s), run {runs}")
    who = [f"{row['callback']}({row['monitor']})" for row in rows]
    width = max(map(len, who), default=0)
    steps = max((len(str(row["step"])) for row in rows), default=1)
    for row, name in zip(rows, who, strict=True):
        print(f"epoch {row['epoch']:>3}  step {row['step']:>{steps}}  {name:<{width}}  {row['reason']}")
