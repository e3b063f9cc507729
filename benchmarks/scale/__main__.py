"""``python -m benchmarks.scale``: per-rank metrics at cluster scale: reading, summarizing and writing.

For each number of ranks (default 16, 64, 256, 1024), simulated rank files of ``--rows`` rows x 4 metrics are
written to a temporary directory (not timed; deleted afterwards) and read by ``read_rank_metrics`` and by a plain
``pandas.read_csv`` loop, interleaved (time, and peak memory in a fresh process); ``lightning-ext ranks`` summarizes
them in a fresh process (time, output size); ``lightning-ext ranks --stragglers`` gives its verdict on simulated
per-rank telemetry with two slow ranks (time, output, what it named). Then ``--writers`` concurrent
``RankMetricsWriter`` processes write (cost per row), and one writer's file-system calls are counted per phase.
Writes ``<out>/scale-<machine>.json``, ``.md`` and ``.png``. See ``benchmarks/README.md``.
"""

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.helpers.machine import cpu_machine, load_average
from benchmarks.scale.data import slow_compute, slow_data, write_run, write_telemetry_run
from benchmarks.scale.reader import READERS, memory, same_values, time_readers
from benchmarks.scale.report import spread, write_chart, write_markdown
from benchmarks.scale.summary import command_runs, start_time, straggler_runs
from benchmarks.scale.writer import file_system_work, writer_costs

__all__ = ["main"]

_NOTES = [
    "Data: each rank's rank_<r>/metrics.csv as the per-rank writer writes it (header epoch,grad_norm,loss,lr,step,"
    "val_loss; float32 values as repr writes them; \\r\\n; val_loss every 500 rows), generated before the timed"
    " region into a temporary directory. Rank R//3's loss diverges after 60% of the steps, rank R//2+1 stops at half"
    " the steps, rank R-2's gradient norm is 4x the others'.",
    "Reading: the plain loop is pandas.read_csv on each file, a rank column, pandas.concat; read_rank_metrics runs"
    " with its default engine (pyarrow where installed) and with engine='pandas'. The three are interleaved, their"
    " order rotating each repeat, with a garbage collection before each; wall time and the process's CPU time (all"
    " threads). The ratio is the median of the per-repeat ratios (read_rank_metrics / plain loop), so a slow spell of"
    " the shared machine weighs on both sides of a ratio.",
    "Same values: both readers give the same numbers in every column (NaN equal to NaN).",
    "Peak memory: a fresh process per reader reads rank 0 once (imports and pools warmed), then every rank; the"
    " figure is the peak resident set size during the read (Linux VmHWM, reset before the read through"
    " /proc/self/clear_refs) less the resident size before it, over the frame's in-memory size (memory_usage(deep))."
    " It includes what the allocators keep.",
    "Summary: python -m lightning_ext ranks LOG_DIR in a fresh process (imports, reading, summarizing, printing);"
    " output sizes of the text and --format json. Start: lightning-ext ranks --help; -X importtime lists the modules"
    " imported.",
    "Writing: W spawned processes, each a RankMetricsWriter on its own rank file in one directory, start together at"
    " a barrier, log the rows (flush_every_n_rows=100) and close (fsync); per-row time of each process (wall, CPU),"
    " median and slowest; rows/s of all of them. File-system work: one writer with os calls (local) or fsspec calls"
    " (memory://) counted per phase.",
]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", metavar="R", help="rank counts (16 64 256 1024)")
    parser.add_argument("--rows", type=int, help="rows per rank file (10000)")
    parser.add_argument("--repeats", type=int, help="timed reads per reader, summaries and writer rounds (5)")
    parser.add_argument("--writers", type=int, nargs="+", metavar="W", help="concurrent writers (1 2 4 8 16)")
    parser.add_argument("--writer-rows", type=int, help="rows per writer (20000)")
    parser.add_argument("--smoke", action="store_true", help="tiny counts for CI, unless given explicitly")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="default: benchmarks/results")
    parser.add_argument("--machine", help="names the output files (default: cpu-<N>core-<arch>)")
    return parser


def _counts(args: argparse.Namespace) -> dict[str, Any]:
    full = {"ranks": [16, 64, 256, 1024], "rows": 10_000, "repeats": 5, "writers": [1, 2, 4, 8, 16]}
    full["writer_rows"] = 20_000
    smoke = {"ranks": [4, 12], "rows": 300, "repeats": 1, "writers": [1, 2], "writer_rows": 500}
    base = smoke if args.smoke else full
    return {name: base[name] if getattr(args, name) is None else getattr(args, name) for name in full}


def _ratios(ours: list[tuple[float, float]], plain: list[tuple[float, float]], *, cpu: bool = False) -> list[float]:
    """Ratios to the plain loop (wall, or CPU), repeat by repeat: the reads of a repeat ran back to back."""
    which = 1 if cpu else 0
    return [mine[which] / theirs[which] for mine, theirs in zip(ours, plain, strict=True)]


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code."""
    args = _parser().parse_args(argv)
    counts = _counts(args)
    if min(counts["ranks"]) < 4 or counts["rows"] < 10 or counts["repeats"] < 1 or min(counts["writers"]) < 1:
        _parser().error("--ranks must be at least 4, --rows at least 10, --repeats and --writers at least 1")
    machine = args.machine or cpu_machine()
    load_before = load_average()
    document: dict[str, Any] = {key: counts[key] for key in ("rows", "repeats", "writer_rows")}
    document.update(reader=[], summary=[], stragglers=[])
    scratch = Path(tempfile.mkdtemp(prefix="lightning-ext-scale-"))
    try:
        for ranks in counts["ranks"]:
            log_dir = scratch / f"ranks-{ranks}"
            write_run(log_dir, ranks, counts["rows"])
            print(f"{ranks} ranks: reading ({counts['repeats']} x {len(READERS)} reads)", flush=True)
            times = time_readers(log_dir, ranks, counts["repeats"])
            plain = times[READERS[0]]
            row: dict[str, Any] = {
                "ranks": ranks,
                "wall_s": {reader: spread([wall for wall, _ in times[reader]]) for reader in READERS},
                "cpu_s": {reader: spread([cpu for _, cpu in times[reader]]) for reader in READERS},
                "ratio": {reader: statistics.median(_ratios(times[reader], plain)) for reader in READERS[1:]},
                "ratio_spread": {reader: spread(_ratios(times[reader], plain)) for reader in READERS[1:]},
                "cpu_ratio": statistics.median(_ratios(times[READERS[1]], plain, cpu=True)),
                "same_values": same_values(log_dir, ranks),
                "load_average": load_average(),
            }
            row["memory"] = {reader: memory(log_dir, ranks, reader) for reader in READERS}
            row["table_rows"] = int(row["memory"][READERS[1]]["rows"])
            document["reader"].append(row)
            print(f"{ranks} ranks: lightning-ext ranks ({counts['repeats']} runs)", flush=True)
            runs = command_runs(log_dir, counts["repeats"])
            document["summary"].append({"ranks": ranks, "wall": spread(runs.pop("wall_s")), **runs})
            shutil.rmtree(log_dir)
            telemetry_dir = scratch / f"telemetry-{ranks}"
            write_telemetry_run(telemetry_dir, ranks, counts["rows"])
            print(f"{ranks} ranks: lightning-ext ranks --stragglers ({counts['repeats']} runs)", flush=True)
            verdict = straggler_runs(telemetry_dir, counts["repeats"])
            planted = sorted([(slow_data(ranks), "data wait"), (slow_compute(ranks), "forward")])
            verdict["planted"] = planted
            document["stragglers"].append({"ranks": ranks, "wall": spread(verdict.pop("wall_s")), **verdict})
            shutil.rmtree(telemetry_dir)
        document["start"] = start_time(max(5, counts["repeats"]))
        document["writer"] = []
        for writers in counts["writers"]:
            print(f"{writers} writer(s) ({counts['repeats']} rounds)", flush=True)
            rounds = []
            for index in range(counts["repeats"]):
                root = scratch / f"writers-{writers}-{index}"
                rounds.append(writer_costs(writers, counts["writer_rows"], root))
                shutil.rmtree(root)
            measured = ("row_wall_us", "row_wall_us_slowest", "row_cpu_us", "rows_per_s_all")
            summary = {key: statistics.median(result[key] for result in rounds) for key in measured}
            document["writer"].append({"writers": writers, "rows": counts["writer_rows"], **summary})
        document["file_system_work"] = file_system_work()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    document["metadata"] = {
        "machine": machine,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.scale", *(sys.argv[1:] if argv is None else argv)]),
        "python": platform.python_version(),
        **{name: _version(name) for name in ("pandas", "pyarrow", "numpy", "fsspec")},
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "notes": _NOTES,
    }
    _write(args.out, f"scale-{machine}", document)
    return 0


def _write(out: Path, name: str, document: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    write_markdown(out / f"{name}.md", document)
    write_chart(out / f"{name}.png", document)
    print((out / f"{name}.md").read_text(encoding="utf-8"))
    print(f"wrote {out / name}.json, .md and .png")


if __name__ == "__main__":
    raise SystemExit(main())
