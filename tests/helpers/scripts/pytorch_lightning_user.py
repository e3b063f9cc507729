"""A user's script written for the standalone package, ``import pytorch_lightning as pl``, run as ``python <script>``.

``Trainer(devices=2)`` re-launches it once per rank. Two fits, with the strategy object and by name; each rank then
writes what it ended with to ``<out>/rank_<r>.json``. With ``PITFALL=log_dir`` a third fit follows, in which rank 0
alone reads ``trainer.log_dir`` (a collective) in ``validation_step``.
"""

import json
import os
import sys

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_ext import PolicyDDPStrategy

TABLE = [[4.0, 3.0, 3.5, 2.0], [4.0, 5.0, 4.5, 3.0]]  # val_loss of rank r at epoch e, not synced


class TableModel(pl.LightningModule):
    def __init__(self, pitfall: bool = False) -> None:
        super().__init__()
        self.pitfall = pitfall
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        if self.pitfall and self.trainer.is_global_zero:
            print(self.trainer.log_dir)
        self.log("val_loss", TABLE[self.global_rank][self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)


def fit(root: str, strategy, pitfall: bool = False) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        max_epochs=4,
        strategy=strategy,
        default_root_dir=root,
        logger=CSVLogger(root),
        callbacks=[
            ModelCheckpoint(monitor="val_loss", filename="{epoch}-{val_loss:.2f}"),
            EarlyStopping(monitor="val_loss", patience=2),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TableModel(pitfall), loader(), loader())
    return trainer


def outcome(trainer: pl.Trainer) -> dict:
    return {
        "strategy": f"{type(trainer.strategy).__module__}.{type(trainer.strategy).__qualname__}",
        "checkpoint_policy": repr(trainer.strategy.checkpoint_policy),
        "best": os.path.basename(trainer.checkpoint_callback.best_model_path),
        "saves": sorted(os.listdir(os.path.join(trainer.log_dir, "checkpoints"))),
        "stopped_epoch": trainer.early_stopping_callback.stopped_epoch,
        "log_dir": trainer.log_dir,
    }


if __name__ == "__main__":
    out = sys.argv[1]
    policies = PolicyDDPStrategy(checkpoint_policy="mean", early_stopping_policy="majority", per_rank_metrics=True)
    first = fit(os.path.join(out, "object"), policies)
    second = fit(os.path.join(out, "name"), "ddp_mean")
    lightning = sorted(name for name in sys.modules if name == "lightning" or name.startswith("lightning."))
    record = {"rank": first.global_rank, "object": outcome(first), "name": outcome(second), "lightning": lightning}
    with open(os.path.join(out, f"rank_{first.global_rank}.json"), "w") as file:
        json.dump(record, file)
    if os.environ.get("PITFALL") == "log_dir":
        fit(os.path.join(out, "pitfall"), "ddp_mean", pitfall=True)
    torch.distributed.destroy_process_group()
