"""A fit in which each rank logs synced epoch means with batch sizes of its own, for the exact-mean tests."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


class MeansModule(L.LightningModule):
    """Logs ``values[rank][batch]`` with ``batch_sizes[rank][batch]`` as a synced epoch mean (and a synced sum)."""

    def __init__(self, values: list[list[float]], batch_sizes: list[list[int]]) -> None:
        super().__init__()
        self.values, self.batch_sizes = values, batch_sizes
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        value = torch.tensor(self.values[self.global_rank][batch_idx])
        size = self.batch_sizes[self.global_rank][batch_idx]
        self.log("mean", value, batch_size=size, on_step=False, on_epoch=True, sync_dist=True)
        self.log("total", value, batch_size=size, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="sum")
        return self.layer(batch[0]).sum() * 0.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit(values: list[list[float]], batch_sizes: list[list[int]], world_size: int, stock: bool) -> dict[str, float]:
    """One epoch on this pool's ranks; returns this rank's synced epoch values."""
    from lightning_ext import PolicyDDPStrategy

    strategy = DDPStrategy(start_method="popen") if stock else PolicyDDPStrategy()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy=strategy,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    data = DataLoader(TensorDataset(torch.zeros(len(values[0]), 1)), batch_size=1)
    trainer.fit(MeansModule(values, batch_sizes), data)
    return {key: float(value) for key, value in trainer.callback_metrics.items()}
