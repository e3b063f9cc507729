"""A ``Trainer.fit`` with per-rank telemetry on every rank of a rank pool, with ranks made slow on purpose.

``slow_data`` sleeps ``delay`` seconds per batch in that rank's dataset (data loading); ``slow_compute`` sleeps
``delay`` in that rank's ``training_step`` before it logs its loss with ``sync_dist=True``, so the other ranks wait
for it inside a collective of the forward (the telemetry's ``collectives`` phase). ``fail_memory_rank``: on that rank,
reading the host's memory fails (``OSError``) after the host record, as a broken ``/proc`` would.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from typing import Any

import lightning as L
import psutil
import torch
import torch.distributed as dist
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

from lightning_ext import PerRankMetrics, PolicyDDPStrategy, RankMetricsWarning, StragglerWarning


def _compute(work: int) -> float:
    """Multiply a 128 x 128 matrix by itself ``work`` times (real computation, not a sleep)."""
    matrix = torch.full((128, 128), 1.0 / 128)
    for _ in range(work):
        matrix = matrix @ matrix
    return float(matrix[0, 0])


class _Data(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int, delay: float, work: int = 0) -> None:
        self.size, self.delay, self.work = size, delay, work

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        _compute(self.work)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(16, generator=generator), torch.randn(1, generator=generator)


class _HeavyBackward(torch.autograd.Function):
    """The identity; its backward first multiplies a 128 x 128 matrix by itself ``work`` times (real computation)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, work: int) -> torch.Tensor:
        ctx.work = work
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad + 0.0 * _compute(ctx.work), None


class _HeavySGD(torch.optim.SGD):
    """SGD whose step first computes ``work`` matrix products (real computation in the optimizer phase)."""

    def __init__(self, params: Any, work: int) -> None:
        super().__init__(params, lr=0.01)
        self.work = work

    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)  # the closure (forward, backward) first, as Lightning's automatic optimization
        _compute(self.work)
        return loss


class _Model(L.LightningModule):
    def __init__(
        self, compute_delay: float, backward_work: int = 0, forward_work: int = 0, optimizer_work: int = 0
    ) -> None:
        super().__init__()
        self.forward_work, self.optimizer_work = forward_work, optimizer_work
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.compute_delay = compute_delay
        self.backward_work = backward_work

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        x = x + 0.0 * _compute(self.forward_work)
        loss = torch.nn.functional.mse_loss(_HeavyBackward.apply(self.net(x), self.backward_work), y)
        if self.compute_delay:
            time.sleep(self.compute_delay)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return _HeavySGD(self.parameters(), self.optimizer_work)


def fit(
    root: str,
    *,
    slow_data: int | None = None,
    slow_compute: int | None = None,
    delay: float = 0.04,
    batches: int = 12,
    every: int = 1,
    telemetry: bool = True,
    fail_memory_rank: int | None = None,
    slow_backward: int | None = None,
    backward_work: int = 0,
    base: float = 0.0,
    window: int | None = 10,
    work_rank: int | None = None,
    work_phase: str = "",
    work: int = 0,
) -> dict[str, Any]:
    """Fit one epoch of ``batches`` batches (batch size 2) on this rank; returns where it ran and what it warned.

    Every rank's data loading takes ``base`` seconds per batch; ``slow_backward``'s backward pass does
    ``backward_work`` matrix products more (:class:`_HeavyBackward`); ``window``: ``PerRankMetrics.straggler_window``.
    ``work_rank`` computes ``work`` matrix products more per batch in ``work_phase`` (``"data"``, ``"forward"``,
    ``"backward"`` or ``"optimizer"``).
    """
    rank = dist.get_rank()
    world = dist.get_world_size()
    heavy = {work_phase: work} if rank == work_rank else {}
    data = _Data(2 * batches * world, (delay if rank == slow_data else 0.0) / 2 + base / 2,  # 2 samples per batch
                 heavy.get("data", 0) // 2)  # fmt: skip
    options = PerRankMetrics(telemetry=telemetry, telemetry_every_n_steps=every, straggler_window=window)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=PolicyDDPStrategy(per_rank_metrics=options),
        max_epochs=1,
        logger=CSVLogger(root, name="", version="v"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    original = psutil.virtual_memory
    calls = [0]

    def failing() -> Any:  # the host record, then the first telemetry row's reading
        calls[0] += 1
        if calls[0] > 1:
            raise OSError("injected")
        return original()

    if rank == fail_memory_rank:
        psutil.virtual_memory = failing
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = _Model(
                delay if rank == slow_compute else 0.0,
                (backward_work if rank == slow_backward else 0) + heavy.get("backward", 0),
                heavy.get("forward", 0),
                heavy.get("optimizer", 0),
            )
            trainer.fit(model, DataLoader(data, batch_size=2))
    finally:
        psutil.virtual_memory = original
    return {
        "log_dir": os.path.join(root, "v"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "warnings": [str(w.message) for w in caught if w.category is RankMetricsWarning],
        "stragglers": [str(w.message) for w in caught if w.category is StragglerWarning],
    }


class _Logged(L.LightningModule):
    """Exact, distinct values: synced and un-synced, step and epoch, a sum, and a validation value."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        value = torch.tensor(100.0 * self.current_epoch + 10 * self.global_rank + batch_idx + 0.25)
        self.log("loss", value, on_step=True, on_epoch=True, sync_dist=True)
        self.log("own", value + 0.5, on_step=True, on_epoch=False)
        self.log("total", value, on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True)
        return self.layer(batch[0]).sum() * 0.0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", torch.tensor(1000.0 + 10 * self.global_rank + batch_idx), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def logged_fit(root: str, *, telemetry: bool) -> str:
    """Two epochs of :class:`_Logged` with per-rank files, telemetry on or off; returns the log directory."""
    data = torch.utils.data.TensorDataset(torch.ones(12, 2))
    per_rank = PerRankMetrics(telemetry=True, telemetry_every_n_steps=1) if telemetry else True
    trainer = L.Trainer(
        accelerator="cpu",
        devices=dist.get_world_size(),
        strategy=PolicyDDPStrategy(per_rank_metrics=per_rank),
        max_epochs=2,
        log_every_n_steps=1,
        logger=CSVLogger(root, name="", version="v"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_Logged(), DataLoader(data, batch_size=2), DataLoader(data, batch_size=4))
    return os.path.join(root, "v")
