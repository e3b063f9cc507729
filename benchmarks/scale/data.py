"""Simulated per-rank metrics files for the scale benchmark: a healthy run with three ranks that misbehave.

Each rank's ``rank_<r>/metrics.csv`` is what the per-rank writer writes for ``rows`` training steps logged one row
per step (``docs/per-rank-metrics.md``): the header ``epoch,grad_norm,loss,lr,step,val_loss``, floats as ``repr``
writes them, ``\\r\\n`` line ends, ``val_loss`` only every :data:`VAL_EVERY` rows (empty elsewhere). Values are
float32 numbers, as ``tensor.item()`` gives them, so the cells are as long as a real run's.

Three ranks stand out, as one does on a real cluster: :func:`diverging` has its loss grow after 60% of the steps,
:func:`straggler` stops at half the steps (its file is shorter), :func:`hot` has a gradient norm 4x the others'.
"""

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "METRICS",
    "VAL_EVERY",
    "diverging",
    "hot",
    "slow_compute",
    "slow_data",
    "straggler",
    "write_rank",
    "write_run",
    "write_telemetry_run",
]

METRICS = ("grad_norm", "loss", "lr", "val_loss")
VAL_EVERY = 500


def diverging(ranks: int) -> int:
    """The rank whose loss grows after 60% of the steps."""
    return ranks // 3


def straggler(ranks: int) -> int:
    """The rank that stops at half the steps."""
    return ranks // 2 + 1


def hot(ranks: int) -> int:
    """The rank whose gradient norm is 4x the others'."""
    return ranks - 2


def write_rank(root: Path, rank: int, ranks: int, rows: int) -> Path:
    """Write one rank's file under ``root``; return its path."""
    rng = np.random.default_rng(rank)
    steps = np.arange(rows if rank != straggler(ranks) else rows // 2)
    progress = steps / max(1, rows - 1)
    loss = 2.0 * np.exp(-3.0 * progress) + 0.1 + 0.02 * rng.standard_normal(len(steps))
    if rank == diverging(ranks):
        loss = loss * np.where(progress > 0.6, np.exp(8.0 * (progress - 0.6)), 1.0)
    grad_norm = rng.gamma(4.0, 0.25, len(steps)) * (4.0 if rank == hot(ranks) else 1.0)
    val = np.where(steps % VAL_EVERY == VAL_EVERY - 1, loss + 0.05, np.nan)
    table = pd.DataFrame(
        {
            "epoch": steps // 1000,
            "grad_norm": grad_norm.astype(np.float32).astype(np.float64),
            "loss": loss.astype(np.float32).astype(np.float64),
            "lr": (1e-3 * (1.0 - 0.9 * progress)).astype(np.float32).astype(np.float64),
            "step": steps,
            "val_loss": val.astype(np.float32).astype(np.float64),
        }
    )
    path = root / f"rank_{rank}" / "metrics.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False, lineterminator="\r\n", na_rep="")
    return path


def write_run(root: Path, ranks: int, rows: int) -> list[Path]:
    """Write ``ranks`` files of ``rows`` rows (the straggler's half) under ``root``."""
    os.makedirs(root, exist_ok=True)
    return [write_rank(root, rank, ranks, rows) for rank in range(ranks)]


TELEMETRY_EVERY = 50  # steps per telemetry row, Lightning's default log_every_n_steps
RANKS_PER_HOST = 8


def slow_data(ranks: int) -> int:
    """The rank whose data loading is 20 ms per batch slower, in the telemetry run."""
    return ranks // 4


def slow_compute(ranks: int) -> int:
    """The rank whose forward is 15 ms per batch slower, in the telemetry run."""
    return 3 * ranks // 4


def write_telemetry_run(root: Path, ranks: int, rows: int) -> None:
    """Per-rank telemetry of ``rows`` steps (a row every :data:`TELEMETRY_EVERY`), host records, two slow ranks."""
    steps = np.arange(TELEMETRY_EVERY - 1, rows, TELEMETRY_EVERY)
    for rank in range(ranks):
        rng = np.random.default_rng(10_000 + rank)
        noise = 1.0 + 0.03 * rng.standard_normal((5, len(steps)))
        data, forward, backward, optimizer, collectives = (
            np.array([[0.002], [0.030], [0.040], [0.004], [0.001]]) * noise
        )
        data = data + (0.020 if rank == slow_data(ranks) else 0.0)
        forward = forward + (0.015 if rank == slow_compute(ranks) else 0.0)
        table = pd.DataFrame(
            {
                "epoch": steps // 1000,
                "step": steps,
                "telemetry/backward_s": backward,
                "telemetry/collectives_s": collectives,
                "telemetry/data_wait_s": data,
                "telemetry/forward_s": forward,
                "telemetry/host_used_bytes": np.full(len(steps), 400 * 2**30),
                "telemetry/optimizer_s": optimizer,
                "telemetry/rss_bytes": (6 * 2**30 * noise[0]).astype(np.int64),
                "telemetry/step_s": np.full(len(steps), 0.1),
                "telemetry/workers_rss_bytes": np.full(len(steps), 2**30),
            }
        )
        path = root / f"rank_{rank}" / "metrics.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(path, index=False, lineterminator="\r\n")
        host = {"host": f"node-{rank // RANKS_PER_HOST}", "host_memory_bytes": 512 * 2**30, "pid": 1, "cpu_count": 64}
        (path.parent / "metrics.csv.host").write_text(json.dumps(host))
