"""The reader part of the scale benchmark: ``read_rank_metrics`` against a plain pandas loop, in time and in memory.

The plain loop is what a user writes without lightning-ext: ``pandas.read_csv`` on each rank's file, a ``rank``
column, ``pandas.concat``. Timings are taken in this process, the readers interleaved (their order rotates each
repeat), with a garbage collection before each read; data generation is outside the timed region. Peak memory is
measured in a fresh subprocess per reader (``python -m benchmarks.scale.reader``): the peak resident set size during
the read (Linux ``VmHWM``, reset just before the read through ``/proc/self/clear_refs``; elsewhere ``ru_maxrss``)
less the resident size before it, over the in-memory size of the frame returned (``memory_usage(deep=True)``).
"""

import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lightning_ext import read_rank_metrics

__all__ = ["READERS", "memory", "plain_loop", "read", "same_values", "time_readers"]

READERS = ("plain pandas loop", "read_rank_metrics", "read_rank_metrics (pandas engine)")


def plain_loop(log_dir: Path, ranks: int) -> pd.DataFrame:
    """``pandas.read_csv`` on each rank's file, a ``rank`` column, one ``concat``."""
    frames = []
    for rank in range(ranks):
        frame = pd.read_csv(log_dir / f"rank_{rank}" / "metrics.csv")
        frame.insert(0, "rank", rank)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def read(reader: str, log_dir: Path, ranks: int, *, warm_up: bool = False) -> pd.DataFrame:
    """Read every rank with one of :data:`READERS` (``warm_up``: rank 0 only)."""
    if reader == READERS[0]:
        return plain_loop(log_dir, 1 if warm_up else ranks)
    chosen = [0] if warm_up else None
    if "pandas engine" in reader:
        return read_rank_metrics(log_dir, engine="pandas", ranks=chosen)
    return read_rank_metrics(log_dir, ranks=chosen)


def time_readers(log_dir: Path, ranks: int, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """``{reader: [(wall s, CPU s of the process, all threads), ...]}``, ``repeats`` reads each, interleaved."""
    times: dict[str, list[tuple[float, float]]] = {reader: [] for reader in READERS}
    for repeat in range(repeats):
        for reader in READERS[repeat % len(READERS) :] + READERS[: repeat % len(READERS)]:
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            table = read(reader, log_dir, ranks)
            times[reader].append((time.perf_counter() - wall, time.process_time() - cpu))
            del table
    return times


def same_values(log_dir: Path, ranks: int) -> bool:
    """Whether both readers return the same numbers, column by column (NaN equal to NaN)."""
    ours, plain = read_rank_metrics(log_dir), plain_loop(log_dir, ranks)
    if len(ours) != len(plain) or set(ours.columns) != set(plain.columns):
        return False
    return all(
        np.array_equal(ours[name].to_numpy(dtype=float, na_value=np.nan), plain[name].to_numpy(dtype=float), True)
        for name in ours.columns
    )


def memory(log_dir: Path, ranks: int, reader: str) -> dict[str, Any]:
    """Peak memory of one read, in a fresh process: ``{"frame_bytes", "peak_bytes", "ratio", "method"}``."""
    process = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale.reader", reader, str(log_dir), str(ranks)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))},
    )
    if process.returncode != 0:
        raise RuntimeError(f"the memory probe of {reader!r} failed:\n{process.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(process.stdout.strip().splitlines()[-1])
    return result


def _status(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _probe(reader: str, log_dir: Path, ranks: int) -> dict[str, Any]:
    read(reader, log_dir, ranks, warm_up=True)  # imports, caches and pools warmed on one file
    gc.collect()
    before = _status("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    method = "ru_maxrss"
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")  # resets VmHWM, the peak resident set size, to the current size
        method = "VmHWM"
    except OSError:
        pass
    table = read(reader, log_dir, ranks)
    peak = _status("VmHWM") if method == "VmHWM" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    frame = int(table.memory_usage(deep=True).sum())
    growth = int((peak or 0) - before)
    return {"rows": len(table), "frame_bytes": frame, "peak_bytes": growth, "ratio": growth / frame, "method": method}


if __name__ == "__main__":
    print(json.dumps(_probe(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))))
