"""The writer part of the scale benchmark: a row's cost as concurrent writers grow, and the file-system work per flush.

**Cost per row.** ``W`` processes (spawned, one per rank), each a :class:`RankMetricsWriter` on its own
``rank_<r>/metrics.csv`` in one directory, wait at a barrier, then each logs ``rows`` rows (4 metrics and ``epoch``,
``flush_every_n_rows=100``) and closes its writer (the final ``fsync``). Each process times that (wall and CPU); the
figure is the time per row, median over the processes (and the slowest), and the rows per second of all of them.

**File-system work.** One writer, in this process, with the ``os`` calls it makes counted by phase (opens,
writes, ``fsync``, renames, truncates, bytes read back): opening, the first flush, a steady flush, a flush that
brings a new metric name (the whole file is rewritten), and closing. The same for an object store (fsspec's
``memory://``): object writes, reads and deletes per phase.
"""

import builtins
import multiprocessing
import os
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from lightning_ext.rank_metrics import RankMetricsWriter

__all__ = ["FLUSH_EVERY", "file_system_work", "writer_costs"]

FLUSH_EVERY = 100
_OS_CALLS = ("open", "write", "fsync", "replace", "rename", "ftruncate", "close", "mkdir", "lstat", "stat")
_STORE_CALLS = ("pipe_file", "cat_file", "rm_file", "rm", "glob", "exists", "find", "ls")


def _row(step: int) -> dict[str, float]:
    row = {"epoch": step // 1000, "grad_norm": 1.0 + (step % 7) / 7, "loss": 2.0 / (1 + step), "lr": 1e-3}
    if step % 500 == 499:
        row["val_loss"] = 2.5 / (1 + step)
    return row


def _worker(path: str, rows: int, barrier: Any, results: Any) -> None:
    prepared = [_row(step) for step in range(rows)]  # not timed
    barrier.wait()
    wall, cpu = time.perf_counter(), time.process_time()
    with RankMetricsWriter(path, flush_every_n_rows=FLUSH_EVERY) as writer:
        for step, row in enumerate(prepared):
            writer.log_metrics(row, step=step)
    results.put((time.perf_counter() - wall, time.process_time() - cpu))


def writer_costs(writers: int, rows: int, root: Path) -> dict[str, Any]:
    """One round of ``writers`` concurrent writer processes under ``root``: their times per row."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(writers), context.Queue()
    processes = [
        context.Process(target=_worker, args=(str(root / f"rank_{rank}" / "metrics.csv"), rows, barrier, results))
        for rank in range(writers)
    ]
    for process in processes:
        process.start()
    times = [results.get(timeout=600) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        if process.exitcode != 0:
            raise RuntimeError(f"a writer process ended with exit code {process.exitcode}")
    walls = [wall for wall, _ in times]
    return {
        "writers": writers,
        "rows": rows,
        "row_wall_us": statistics.median(walls) / rows * 1e6,
        "row_wall_us_slowest": max(walls) / rows * 1e6,
        "row_cpu_us": statistics.median(cpu for _, cpu in times) / rows * 1e6,
        "rows_per_s_all": writers * rows / max(walls),
    }


@contextmanager
def _counting(owner: Any, names: tuple[str, ...], counts: Counter[str]) -> Iterator[None]:
    originals = {name: getattr(owner, name) for name in names if hasattr(owner, name)}

    def counted(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            result = function(*args, **kwargs)
            if name == "cat_file" and isinstance(result, bytes):
                counts["bytes read"] += len(result)
            return result

        return call

    for name, function in originals.items():
        setattr(owner, name, counted(name, function))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(owner, name, function)


def _phases(location: str, count: Callable[[], AbstractContextManager[Counter[str]]]) -> dict[str, dict[str, int]]:
    phases: dict[str, dict[str, int]] = {}
    with count() as counts:
        writer = RankMetricsWriter(location, flush_every_n_rows=FLUSH_EVERY)
    phases["open"] = dict(counts)
    step = 0
    for phase, rows, extra in (
        ("first flush (the file, with its header)", FLUSH_EVERY, {}),
        ("second flush (opens the file to append)", FLUSH_EVERY, {}),
        ("each later flush (100 rows appended)", FLUSH_EVERY, {}),
        ("a flush with a new metric (file rewritten)", FLUSH_EVERY, {"new_metric": 1.0}),
        ("the flush after it (opens the new file)", FLUSH_EVERY, {}),
    ):
        with count() as counts:
            for _ in range(rows):
                row = {"epoch": 0, "grad_norm": 1.0, "loss": 1.0 / (1 + step), "lr": 1e-3}  # no val_loss: no new name
                writer.log_metrics({**row, **(extra if step % FLUSH_EVERY == 0 else {})}, step=step)
                step += 1
        phases[phase] = dict(counts)
    with count() as counts:
        writer.close()
    phases["close"] = dict(counts)
    with count() as counts:
        RankMetricsWriter(location, flush_every_n_rows=FLUSH_EVERY).close()
    phases["a new run's writer (the old file moved aside)"] = dict(counts)
    return phases


def file_system_work() -> dict[str, dict[str, dict[str, int]]]:
    """The counted calls of each phase of a writer's life, on a local disk and on an object store."""

    @contextmanager
    def local_count() -> Iterator[Counter[str]]:
        counts: Counter[str] = Counter()
        real_open = builtins.open

        def counted_open(*args: Any, **kwargs: Any) -> Any:
            counts["open"] += 1
            handle = real_open(*args, **kwargs)
            if "r" in str(args[1] if len(args) > 1 else kwargs.get("mode", "r")):
                size = os.fstat(handle.fileno()).st_size
                counts["bytes read"] += size
            return handle

        with _counting(os, _OS_CALLS, counts):
            builtins.open = counted_open
            try:
                yield counts
            finally:
                builtins.open = real_open

    import fsspec

    store = fsspec.filesystem("memory")

    @contextmanager
    def store_count() -> Iterator[Counter[str]]:
        counts: Counter[str] = Counter()
        with _counting(store, _STORE_CALLS, counts):
            yield counts

    with tempfile.TemporaryDirectory() as directory:
        local = _phases(os.path.join(directory, "rank_0", "metrics.csv"), local_count)
    remote = _phases(f"memory:///scale-{uuid.uuid4().hex}/rank_0/metrics.csv", store_count)
    return {"local": local, "object store (memory://)": remote}
