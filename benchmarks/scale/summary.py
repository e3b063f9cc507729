"""The summary part of the scale benchmark: ``lightning-ext ranks`` end to end, and how fast the command starts.

Each figure is a fresh ``python -m lightning_ext ranks`` process, as a user runs it: its wall time (reading the files,
summarizing, printing), and the size of what it prints (text and ``--format json``). The start time is that of
``lightning-ext ranks --help`` (imports and argument parsing only), next to ``python -c pass`` on the same machine;
``-X importtime`` shows whether Lightning or torch is imported (it must not be).
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["command_runs", "start_time", "straggler_runs"]

_HEAVY = ("torch", "lightning", "matplotlib", "psutil")


def _run(arguments: list[str]) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    process = subprocess.run([sys.executable, *arguments], capture_output=True, timeout=1800, env=env)
    return time.perf_counter() - start, process


def command_runs(log_dir: Path, repeats: int) -> dict[str, Any]:
    """Wall times of ``lightning-ext ranks LOG_DIR`` (text) and the sizes of its text and JSON outputs."""
    walls = []
    text = b""
    for _ in range(repeats):
        wall, process = _run(["-m", "lightning_ext", "ranks", str(log_dir)])
        if process.returncode != 0:
            raise RuntimeError(f"lightning-ext ranks failed:\n{process.stderr.decode()[-3000:]}")
        walls.append(wall)
        text = process.stdout
    _, as_json = _run(["-m", "lightning_ext", "ranks", str(log_dir), "--format", "json"])
    return {
        "wall_s": walls,
        "text_bytes": len(text),
        "text_lines": text.count(b"\n"),
        "json_bytes": len(as_json.stdout),
        "text": text.decode(),
    }


def straggler_runs(log_dir: Path, repeats: int) -> dict[str, Any]:
    """Wall times of ``lightning-ext ranks LOG_DIR --stragglers``, its text, and the (rank, phase) pairs it names."""
    walls = []
    text = b""
    for _ in range(repeats):
        wall, process = _run(["-m", "lightning_ext", "ranks", str(log_dir), "--stragglers"])
        if process.returncode != 0:
            raise RuntimeError(f"lightning-ext ranks --stragglers failed:\n{process.stderr.decode()[-3000:]}")
        walls.append(wall)
        text = process.stdout
    _, as_json = _run(["-m", "lightning_ext", "ranks", str(log_dir), "--stragglers", "--format", "json"])
    found = sorted((entry["rank"], entry["phase"]) for entry in json.loads(as_json.stdout)["stragglers"])
    return {"wall_s": walls, "text_bytes": len(text), "text_lines": text.count(b"\n"), "text": text.decode(),
            "found": found}  # fmt: skip


def start_time(repeats: int) -> dict[str, Any]:
    """``lightning-ext ranks --help`` against ``python -c pass``, and the heavy modules it imports (none expected)."""
    help_walls = [_run(["-m", "lightning_ext", "ranks", "--help"])[0] for _ in range(repeats)]
    bare_walls = [_run(["-c", "pass"])[0] for _ in range(repeats)]
    _, timed = _run(["-X", "importtime", "-m", "lightning_ext", "ranks", "--help"])
    imported = [line.split("|")[-1].strip() for line in timed.stderr.decode().splitlines() if "|" in line]
    heavy = sorted({name for name in imported if name.split(".")[0] in _HEAVY})
    return {
        "help_wall_s": help_walls,
        "python_wall_s": bare_walls,
        "median_help_s": statistics.median(help_walls),
        "median_python_s": statistics.median(bare_walls),
        "heavy_imports": heavy,
        "modules_imported": len(imported),
    }
