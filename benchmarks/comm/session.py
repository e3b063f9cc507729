"""One benchmark session, as run by each rank: join the process group, measure, send rank 0's results back.

:func:`rank_main` is the entry point of every spawned rank (see :mod:`benchmarks.comm.launch`). The rank sets the
environment a launcher would (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``NODE_RANK``), so Lightning treats the processes as externally launched and reuses the process group initialised
here. Every collective has a deadline (the process group's timeout), so a lost rank becomes an error, not a hang.
"""

import logging
import os
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.comm.decisions import DecisionResult, run_decisions
from benchmarks.comm.gpu import probe, rank_device
from benchmarks.comm.plan import COLLECTIVE_TIMEOUT_S, Counts, SessionSpec
from benchmarks.comm.training import TrainingResult, run_training

__all__ = ["SessionResult", "rank_main"]

_PROGRESS_EVERY_S = 0.5


@dataclass
class SessionResult:
    """What rank 0 sends back.

    Attributes:
        spec: the session.
        decisions: the decision measurements, if any.
        training: the training-step measurements, if any.
        skipped: why nothing was measured (e.g. gloo refuses CUDA tensors here), else ``None``.

    """

    spec: SessionSpec
    decisions: DecisionResult | None = None
    training: TrainingResult | None = None
    skipped: str | None = None


class _Progress:
    """Batches progress reports from rank 0 to the parent (one small message every half second at most)."""

    def __init__(self, queue: Any, enabled: bool) -> None:
        self._queue, self._enabled = queue, enabled
        self._pending, self._last = 0, time.monotonic()

    def __call__(self, done: int) -> None:
        if not self._enabled:
            return
        self._pending += done
        if time.monotonic() - self._last >= _PROGRESS_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self._enabled and self._pending:
            self._queue.put(("progress", self._pending))
            self._pending, self._last = 0, time.monotonic()


def rank_main(rank: int, spec: SessionSpec, counts: Counts, workdir: str, port: int, queue: Any) -> None:
    """Run the session on one rank; rank 0 puts ``("result", SessionResult)`` on ``queue``.

    Args:
        rank: this process's rank (the spawn index).
        spec: the session.
        counts: how much to measure.
        workdir: a directory shared by the ranks (training logs).
        port: the rendezvous port on localhost.
        queue: the parent's result queue.

    Raises:
        ValueError: ``spec.device`` is neither ``"cpu"`` nor ``"cuda"``.

    """
    device = rank_device(spec.device)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(spec.world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
    )
    _quiet()
    torch.set_num_threads(1)
    dist.init_process_group(
        spec.backend, rank=rank, world_size=spec.world_size, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    try:
        result = SessionResult(spec, skipped=probe(device))
        progress = _Progress(queue, enabled=rank == 0)
        if result.skipped is None and spec.decisions:
            result.decisions = run_decisions(
                device,
                world_size=spec.world_size,
                rank=rank,
                decisions=counts.decisions,
                warmup=counts.warmup,
                seed=counts.seed,
                progress=progress,
            )
        if result.skipped is None and spec.training:
            result.training = run_training(
                world_size=spec.world_size,
                train_steps=counts.train_steps,
                repeats=counts.repeats,
                seed=counts.seed,
                workdir=os.path.join(workdir, spec.label.replace("/", "-").replace(" ", "-")),
                progress=progress,
                only=counts.configs,
            )
        progress.flush()
        if rank == 0:
            queue.put(("result", result))
    finally:
        dist.destroy_process_group()


def _quiet() -> None:
    """The parent's progress bar owns the terminal: Lightning's info lines and warnings stay in the ranks."""
    warnings.simplefilter("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_ext"):
        logging.getLogger(name).setLevel(logging.ERROR)
