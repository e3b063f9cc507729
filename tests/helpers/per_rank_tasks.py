"""``Trainer.fit`` runs for the per-rank isolation and remote-storage tests, run on every rank of a rank pool.

Each rank logs, per step, ``loss`` (synced, step and epoch) and ``own`` (not synced), optionally ``rank`` (synced: a
reserved name) and ``tm``, a ``torchmetrics`` mean whose *local* ``compute()`` raises on one rank. A fault can be
put on one rank: ``"enospc"`` (``os.write`` to its metrics file fails with ``ENOSPC`` after a few writes: a full
disk, injected at the OS boundary), ``"events_enospc"`` (the same for its TensorBoard event file, which TensorBoard's
writer appends with ``io.open``) or ``"dir_is_file"`` (a file stands where its directory should be). The run itself
is real: DDP, gloo, Lightning's loops and loggers (``tensorboard=True``: a ``TensorBoardLogger``, else a
``CSVLogger``).

Rank ``r``'s value at (epoch ``e``, batch ``b``) is ``100 e + 10 r + b``; the parent derives every expected cell from
that formula.
"""

from __future__ import annotations

import errno
import io
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import lightning as L
import pandas as pd
import torch
import torch.distributed as dist
import torchmetrics
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_ext import PerRankMetrics, PolicyDDPStrategy, read_rank_metrics
from lightning_ext.rank_metrics import RankMetricsWarning
from tests.helpers.s3 import use_s3

VERSION = "v"


class LocallyFailingMean(torchmetrics.MeanMetric):
    """A mean whose un-synced ``compute()`` raises on one rank; the synced one (what Lightning logs) works."""

    def __init__(self, failing_rank: int) -> None:
        super().__init__()
        self.failing_rank = failing_rank

    def compute(self) -> torch.Tensor:
        if not self._to_sync and dist.get_rank() == self.failing_rank:
            raise RuntimeError(f"local compute failed on rank {self.failing_rank}")
        return super().compute()


class Model(L.LightningModule):
    def __init__(self, log_rank: bool, failing_metric_rank: int | None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.log_rank = log_rank
        self.tm = None if failing_metric_rank is None else LocallyFailingMean(failing_metric_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        value = torch.tensor(100.0 * self.current_epoch + 10 * self.global_rank + batch_idx)
        self.log("loss", value, on_step=True, on_epoch=True, sync_dist=True)
        self.log("own", value + 0.5, on_step=True, on_epoch=False)
        if self.log_rank:
            self.log("rank", torch.tensor(float(self.global_rank)), on_step=True, on_epoch=False, sync_dist=True)
        if self.tm is not None:
            self.tm.update(value)
            self.log("tm", self.tm, on_step=False, on_epoch=True)
        return self.layer(batch[0]).sum() * 0.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit(root: str, *, s3: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """Fit on this rank; returns how the run ended, this rank's RankMetricsWarnings, and optionally its own table.

    ``s3``: the options that reach the test S3 server (``tests/helpers/s3.py``), set for the whole run.
    """
    with use_s3(s3) if s3 is not None else nullcontext():
        return _fit(root, **options)


def _fit(
    root: str,
    *,
    epochs: int = 2,
    batches: int = 3,
    flush_every: int = 100,
    fault: str | None = None,
    fault_rank: int = 1,
    log_rank: bool = False,
    failing_metric_rank: int | None = None,
    read_back: bool = False,
    tensorboard: bool = False,
    telemetry: bool = False,
) -> dict[str, Any]:
    world, rank = dist.get_world_size(), dist.get_rank()
    log_dir = f"{root}/lightning_logs/{VERSION}" if "://" in root else os.path.join(root, "lightning_logs", VERSION)
    faulty = fault if rank == fault_rank else None
    if faulty == "dir_is_file":
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, f"rank_{rank}"), "w") as handle:
            handle.write("a file where this rank's directory should be")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=PolicyDDPStrategy(
            per_rank_metrics=PerRankMetrics(flush_every_n_rows=flush_every, telemetry=telemetry)
        ),
        max_epochs=epochs,
        logger=(TensorBoardLogger if tensorboard else CSVLogger)(root, version=VERSION),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        deterministic=True,
    )
    data = DataLoader(TensorDataset(torch.zeros(batches * world, 2)), batch_size=1)
    full = {"enospc": _full_disk, "events_enospc": _full_disk_for_events}.get(faulty or "")
    with full(log_dir) if full is not None else nullcontext():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(Model(log_rank, failing_metric_rank), data)
        table = read_rank_metrics(trainer.log_dir).to_dict(orient="list") if read_back else None
    return {
        "rank": rank,
        "log_dir": trainer.log_dir,
        "status": trainer.state.status.value,
        "global_step": trainer.global_step,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, RankMetricsWarning)],
        "table": table,
    }


@contextmanager
def _full_disk(log_dir: str, allowed: int = 2) -> Iterator[None]:
    """``os.write`` to this rank's metrics file (or its temporary copy) fails with ENOSPC after ``allowed`` writes.

    The descriptors are recognised where they are opened (``os.open``), so nothing else this process writes is hit.
    """
    real_open, real_write, real_close = os.open, os.write, os.close
    target = re.compile(r"metrics\.csv|\.metrics\.csv\.[0-9]+\.tmp")
    directory = os.path.abspath(log_dir)
    watched: set[int] = set()
    seen = [0]

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, flags, *args, **kwargs)
        full = os.path.abspath(os.fspath(path))
        if full.startswith(directory) and target.fullmatch(os.path.basename(full)):
            watched.add(fd)
        return fd

    def write(fd: int, data: Any) -> int:
        if fd in watched:
            seen[0] += 1
            if seen[0] > allowed:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    def close(fd: int) -> None:
        watched.discard(fd)
        real_close(fd)

    os.open, os.write, os.close = open_, write, close
    try:
        yield
    finally:
        os.open, os.write, os.close = real_open, real_write, real_close


@contextmanager
def _full_disk_for_events(log_dir: str, allowed: int = 3) -> Iterator[None]:
    """Opening this rank's TensorBoard event file fails with ENOSPC after ``allowed`` opens.

    TensorBoard's writer opens the file for each record it writes (``io.open``, from its own writer thread).
    """
    real_open = io.open
    directory = os.path.abspath(log_dir)
    seen = [0]

    def open_(path: Any, *args: Any, **kwargs: Any) -> Any:
        full = os.path.abspath(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
        if full.startswith(directory) and os.path.basename(full).startswith("events.out.tfevents."):
            seen[0] += 1
            if seen[0] > allowed:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), full)
        return real_open(path, *args, **kwargs)

    io.open = open_
    try:
        yield
    finally:
        io.open = real_open


# ---- the parent's side: runs in a pool, and the expected rows from the value formula above ---------------------------
WORLD, EPOCHS, BATCHES = 2, 2, 3


def expected_rows(rank: int, log_rank: bool = False, tm: bool = False) -> list[dict[str, float]]:
    """Rank ``rank``'s rows in file order: each step's, then the epoch's (see the module docstring)."""
    rows = []
    for epoch in range(EPOCHS):
        values = [100.0 * epoch + 10 * rank + batch for batch in range(BATCHES)]
        for value in values:
            rows.append(
                {"epoch": epoch, "loss_step": value, "own": value + 0.5, **({"metric:rank": rank} if log_rank else {})}
            )
        mean = sum(values) / BATCHES
        rows.append({"epoch": epoch, "loss_epoch": mean, **({"tm": mean} if tm else {})})
    return rows


def run(pool: Any, root: Path | str, **options: Any) -> list[dict[str, Any]]:
    results = pool.run("tests.helpers.per_rank_tasks:fit", (str(root),), timeout=180, **options)
    assert [r["status"] for r in results] == ["finished"] * WORLD  # the run completes on every rank
    assert [r["global_step"] for r in results] == [EPOCHS * BATCHES] * WORLD
    return results


def check_rows(table: pd.DataFrame, rank: int, stock: pd.DataFrame, expected: list[dict[str, float]]) -> None:
    mine = table[table["rank"] == rank].reset_index(drop=True)
    assert mine["step"].tolist() == stock["step"].tolist()[: len(mine)]
    for index, row in enumerate(expected[: len(mine)]):
        cells = {name: mine.at[index, name] for name in mine.columns if name not in ("rank", "step")}
        present = {name: float(value) for name, value in cells.items() if not pd.isna(value)}
        assert present == row, f"rank {rank}, row {index}"
