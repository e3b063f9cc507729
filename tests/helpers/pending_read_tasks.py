"""A read of a synced value inside the hook that logged it, under ``if trainer.is_global_zero:`` (rank pools): it must
neither hang nor raise, and every value read after the hook must be stock's."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

STEPS = 3


def line_of(marker: str) -> int:
    """The line of this file that holds ``marker`` (where a warning must point)."""
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if marker in line and "line_of(" not in line)


class GuardedRead(L.LightningModule):
    """Logs a synced mean and a synced max, then reads them on rank 0 only, inside ``training_step``."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.inside: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("g", torch.tensor(float(self.global_rank + batch_idx)), sync_dist=True)
        self.log("g_max", torch.tensor(float(self.global_rank * 10)), sync_dist=True, reduce_fx="max")
        if self.trainer.is_global_zero:
            self.inside.append(float(self.trainer.callback_metrics["g"]))  # the guarded read
        return self.layer(batch[0]).sum() * 0.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


class After(L.Callback):
    """What a callback reads once the hook returned."""

    def __init__(self) -> None:
        self.reads: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        self.reads.append({name: float(value) for name, value in trainer.callback_metrics.items()})


def guarded_read(stock: bool) -> dict[str, Any]:
    """A fit whose ``training_step`` reads its synced value on rank 0 only; what every rank saw and was warned of."""
    from lightning_ext import PolicyDDPStrategy

    after, module = After(), GuardedRead()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=dist.get_world_size(),
        strategy="ddp" if stock else PolicyDDPStrategy(),
        max_steps=STEPS,
        logger=False,
        callbacks=[after],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, DataLoader(TensorDataset(torch.zeros(STEPS, 2)), batch_size=1))
    return {
        "inside": module.inside,
        "after": after.reads,
        "warnings": [
            (str(warning.message).splitlines()[0], warning.filename, warning.lineno)
            for warning in caught
            if type(warning.message).__name__ == "UnsyncedReadWarning"
        ],
    }
