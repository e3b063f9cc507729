"""A user's training script, launched for real by the tests (popen or spawn start method).

Usage: python launch.py OUT_JSON START_METHOD DEVICES POLICY
Every rank appends its outcome as one JSON line to OUT_JSON.
"""

import json
import os
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_ext import PolicyDDPStrategy

TABLE = [[4.0, 3.0, 3.5, 2.0], [4.0, 5.0, 4.5, 3.0], [4.0, 5.0, 4.5, 6.0]]


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.tensor(TABLE[self.global_rank][self.current_epoch]))
        self.log("rank_seen", float(self.global_rank))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Reporter(L.Callback):
    """Writes each rank's outcome from inside the rank (under spawn, code after fit runs in the main process only)."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        checkpoint = trainer.checkpoint_callback
        record = {
            "rank": trainer.global_rank,
            "pid": os.getpid(),
            "best": os.path.basename(checkpoint.best_model_path),
            "should_stop": trainer.should_stop,
            "log_dir": trainer.log_dir,
        }
        with open(self.out, "a") as handle:
            handle.write(json.dumps(record) + "\n")


def loader():
    return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)


def main() -> None:
    out, start_method, devices, policy = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    checkpoint = ModelCheckpoint(monitor="val_loss", filename="{epoch}-{val_loss:.2f}")
    stopping = EarlyStopping(monitor="val_loss", patience=3)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=PolicyDDPStrategy(
            start_method=start_method, checkpoint_policy=policy, early_stopping_policy="all", per_rank_metrics=True
        ),
        max_epochs=4,
        callbacks=[checkpoint, stopping, Reporter(out)],
        logger=CSVLogger(os.path.dirname(out)),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=os.path.dirname(out),
    )
    trainer.fit(Model(), loader(), loader())
    if torch.distributed.is_initialized():  # see README, "Noticed upstream": exit without it can SIGABRT (gloo)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
