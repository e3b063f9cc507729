"""Simulated per-rank metrics files for the scale benchmark: a healthy run with three ranks that misbehave.

Each rank's ``rank_<r>/metrics.csv`` is what the per-rank writer writes for ``rows`` training steps logged one row
per step (``docs/per-rank-metrics.md``): the header ``epoch,grad_norm,loss,lr,step,val_loss``, floats as ``repr``
writes them, ``\\r\\n`` line ends, ``val_loss`` only every :data:`VAL_EVERY` rows (empty elsewhere). Values are
float32 numbers, as ``tensor.item()`` gives them, so the cells are as long as a real run's.

Three ranks stand out, as one does on a real cluster: :func:`diverging` has its loss grow after 60% of the steps,
:func:`straggler` stops at half the steps (its file is shorter), :func:`hot` has a gradient norm 4x the others'.
"""

import os
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["METRICS", "VAL_EVERY", "diverging", "hot", "straggler", "write_rank", "write_run"]

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
