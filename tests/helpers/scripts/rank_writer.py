"""A process that writes a per-rank metrics file and dies a hard death, for the fault tests.

Usage:
    python rank_writer.py loop PATH FLUSH_EVERY
        Logs row i = expected_row(i) for i = 0, 1, 2, ... until killed. Before logging row i it reports ``L i``, and
        after every flush ``F n`` (n = rows in the file), one line each on stdout, unbuffered: what a test reads back
        after SIGKILL is exactly what the process had reported.
    python rank_writer.py crash STAGE PATH
        Flushes rows 0-9, then logs row 10 with a new metric name, which rewrites the whole file, and ends the
        process with ``os._exit(CRASH_CODE)`` at STAGE of that rewrite (see CRASH_STAGES).

The module is loaded without running ``lightning_ext/__init__.py``, which imports Lightning (seconds per process).
"""

import os
import sys
import types
from pathlib import Path

CRASH_CODE = 3
CRASH_STAGES = ("temp_write", "temp_fsync", "replace", "after_replace")
FIRST_ROWS = 10


def expected_row(i: int) -> dict[str, float]:
    """Row i: a loss from step 0, an accuracy from step 37, a learning rate from step 150 (header rewrites)."""
    row = {"loss": 1.0 / (i + 3) + i}
    if i >= 37:
        row["acc, top-1"] = i / 7
    if i >= 150:
        row['lr "peak"\nsched'] = -i * 1e-300
    return row


def _load_rank_metrics() -> types.ModuleType:
    package = types.ModuleType("lightning_ext")
    package.__path__ = [str(Path(__file__).resolve().parents[3] / "lightning_ext")]
    sys.modules["lightning_ext"] = package
    import lightning_ext.rank_metrics as rank_metrics

    return rank_metrics


def _report(text: str) -> None:
    os.write(1, f"{text}\n".encode())


def _loop(path: str, flush_every: int) -> None:
    writer = _load_rank_metrics().RankMetricsWriter(path, flush_every_n_rows=flush_every)
    flushed = 0
    i = 0
    while True:
        _report(f"L {i}")
        writer.log_metrics(expected_row(i), step=i)
        if writer.rows_written != flushed:
            flushed = writer.rows_written
            _report(f"F {flushed}")
        i += 1


def _crash(stage: str, path: str) -> None:
    writer = _load_rank_metrics().RankMetricsWriter(path, flush_every_n_rows=5)
    for i in range(FIRST_ROWS):
        writer.log_metrics({"loss": float(i)}, step=i)
    real_write, real_replace = os.write, os.replace

    def torn_write(fd: int, data: bytes) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))
        os._exit(CRASH_CODE)

    def replace_then_die(source: str, target: str) -> None:
        real_replace(source, target)
        os._exit(CRASH_CODE)

    def die(*args: object) -> None:
        os._exit(CRASH_CODE)

    if stage == "temp_write":
        os.write = torn_write  # the next write is the temporary file's
    elif stage == "temp_fsync":
        os.fsync = die
    elif stage == "replace":
        os.replace = die
    elif stage == "after_replace":
        os.replace = replace_then_die
    else:
        raise SystemExit(f"unknown stage {stage!r}")
    writer.log_metrics({"loss": 10.0, "acc": 0.5}, step=FIRST_ROWS)
    writer.flush()
    raise SystemExit("the crash did not happen")


def main() -> None:
    mode = sys.argv[1]
    if mode == "loop":
        _loop(sys.argv[2], int(sys.argv[3]))
    elif mode == "crash":
        _crash(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
