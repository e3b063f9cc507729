"""A 2-rank training script whose rank 1 kills itself with SIGKILL mid-run (launched for real by the tests).

Usage: python killed_rank.py ROOT KILL_AT_STEP FLUSH_EVERY
Rank 1 writes ROOT/killed.json (rows it had flushed and logged) just before it kills itself.
"""

import json
import os
import signal
import sys
from datetime import timedelta

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_ext import PerRankMetrics, PolicyDDPStrategy


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss + self.global_rank)
        self.log("rank_value", float(self.global_rank * 1000 + self.global_step))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class KillRankOne(L.Callback):
    def __init__(self, root: str, at_step: int) -> None:
        self.root, self.at_step = root, at_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == 1 and trainer.global_step == self.at_step:
            rank_logger = trainer.strategy.rank_metrics_logger
            report = {"flushed": rank_logger.experiment.rows_written, "logged": rank_logger.rows_logged}
            with open(os.path.join(self.root, "killed.json"), "w") as handle:
                json.dump({**report, "path": rank_logger.path}, handle)
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    root, at_step, flush_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        # the process group's timeout is also the store's wait for the ranks to join: on a loaded machine rank 0 can
        # reach it more than 20 s after rank 1 (CI: rank 1 refused for 20 s, then rank 0 waited 21 s alone)
        strategy=PolicyDDPStrategy(
            per_rank_metrics=PerRankMetrics(flush_every_n_rows=flush_every), timeout=timedelta(seconds=120)
        ),
        max_epochs=1,
        logger=CSVLogger(root),
        log_every_n_steps=1,
        callbacks=[KillRankOne(root, at_step)],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(400, 2)), batch_size=2))


if __name__ == "__main__":
    main()
