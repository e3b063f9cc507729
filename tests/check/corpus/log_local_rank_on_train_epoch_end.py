"""A synced self.log under `if self.trainer.local_rank == 0:` in on_train_epoch_end (pytorch_lightning's names)."""

import pytorch_lightning as pl
from pytorch_lightning.demos.boring_classes import BoringModel


class Model(BoringModel):
    def on_train_epoch_end(self):
        if self.trainer.local_rank == 0:
            self.log("epoch_metric", 1.0, sync_dist=True)  # expect: LX101


class Printer(pl.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.local_rank == 0:
            print("epoch", trainer.current_epoch)
