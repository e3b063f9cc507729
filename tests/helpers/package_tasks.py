"""Rank-pool tasks: a ``pytorch_lightning`` run given an object of ``lightning``, as a user might mix them up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as L
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_ext.pytorch_lightning import PolicyDDPStrategy


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_with_lightning_object(root: str, what: str) -> str:
    """Fit a ``pytorch_lightning`` run holding ``lightning``'s ``what``; the error this rank raised, as text."""
    options: dict[str, Any] = {"logger": False, "callbacks": []}
    if what == "callback":
        options["callbacks"] = [L.callbacks.ModelCheckpoint(monitor="loss", dirpath=root)]
    elif what == "logger":
        options["logger"] = L.loggers.CSVLogger(root)
    try:
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=2,
            max_epochs=1,
            strategy=PolicyDDPStrategy(),
            default_root_dir=str(Path(root)),
            enable_progress_bar=False,
            enable_model_summary=False,
            **options,
        )
        trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2))
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "no error"
