"""``python -m benchmarks.check``: ``lightning-ext check`` over Lightning's own code, timed as a user waits for it.

The set: Lightning's ``examples/`` and ``tests/tests_pytorch/`` (extracted once by ``python -m
benchmarks.check.sources``) and the installed ``lightning`` and ``pytorch_lightning``. Each repeat runs the command
in a fresh process (``python -m lightning_ext.check --format json ...``) and times its wall clock, start-up included,
and its CPU time. The target, under 10 s of wall clock for the whole set (median), is judged only when every part is
there; a missing part is named, and the run goes on with the others. Writes ``<out>/check-<machine>.json`` and
``.md``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.check.sources import PARTS, default_root, installed, parts_at
from benchmarks.helpers.machine import cpu_machine, load_average
from lightning_ext.check import check_paths

__all__ = ["main"]

LIMIT_S = 10.0


def _timed(paths: list[Path]) -> tuple[float, float, list[dict[str, Any]]]:
    """One run of the command in a fresh process: its wall-clock seconds, its CPU seconds, its findings."""
    command = [sys.executable, "-m", "lightning_ext.check", "--format", "json", *map(str, paths)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.run(command, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}:\n{process.stderr}")
    findings: list[dict[str, Any]] = json.loads(process.stdout)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, findings


def _markdown(document: dict[str, Any]) -> str:
    meta, target = document["metadata"], document["target"]
    lines = [
        f"# `lightning-ext check` over Lightning's code ({meta['machine']}, {meta['date']})",
        "",
        f"Lightning {meta['lightning']}; examples and tests at {meta['sources'].get('ref', 'unknown')}"
        f" ({meta['sources'].get('commit', 'unknown')[:10]}); load average before: {meta['load_average_before']}.",
        "",
        "| part | files | findings |",
        "|---|---:|---:|",
        *(f"| {name} | {part['files']} | {part['findings']} |" for name, part in document["parts"].items()),
        "",
        f"Whole set, {len(document['wall_s'])} run(s), each a fresh process: median {document['median_s']:.2f} s"
        f" (min {min(document['wall_s']):.2f} s, max {max(document['wall_s']):.2f} s), CPU time median"
        f" {statistics.median(document['cpu_s']):.2f} s (what a busy machine does not inflate);"
        f" {len(document['findings'])} finding(s).",
        "",
        f"Target: under {LIMIT_S:.0f} s: "
        + (
            "not judged (missing: " + ", ".join(target["missing"]) + ")"
            if target["met"] is None
            else "met"
            if target["met"]
            else "**missed**"
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.check", description=__doc__)
    parser.add_argument("--sources", type=Path, default=None, help="the extracted parts (default: the cache)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of the whole set")
    parser.add_argument("--smoke", action="store_true", help="one run: does it work (CI)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--machine", default=None, help="the results' file name part (default: this machine's)")
    args = parser.parse_args(argv)
    root = args.sources or default_root()
    extracted, origin = parts_at(root)
    missing = [part for part in PARTS if part not in extracted]
    if missing:
        print(f"not found under {root}: {', '.join(missing)} (python -m benchmarks.check.sources --git-dir ...)")
    every = {**extracted, **installed()}
    load, started = load_average(), time.time()
    parts = {}
    for name, path in every.items():  # what each part holds (in this process: not timed)
        checked = check_paths([path])
        parts[name] = {"path": str(path), "files": checked.files, "findings": len(checked.findings)}
    walls: list[float] = []
    cpus: list[float] = []
    findings: list[dict[str, Any]] = []
    for _ in range(1 if args.smoke else args.repeats):
        wall, cpu, findings = _timed(list(every.values()))
        walls.append(round(wall, 3))
        cpus.append(round(cpu, 3))
    from importlib.metadata import version

    median = statistics.median(walls)
    document: dict[str, Any] = {
        "metadata": {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "machine": args.machine or cpu_machine(),
            "load_average_before": load,
            "lightning": version("lightning"),
            "sources": origin,
        },
        "parts": parts,
        "wall_s": walls,
        "median_s": median,
        "cpu_s": cpus,
        "findings": findings,
        "target": {"limit_s": LIMIT_S, "missing": missing, "met": None if missing else median < LIMIT_S},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"check-{document['metadata']['machine']}"
    stem.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
    text = _markdown(document)
    stem.with_suffix(".md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
