"""Aliases: `trainer = self.trainer` and `rank = trainer.global_rank` before the guard."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        trainer = self.trainer
        rank = trainer.global_rank
        if rank == 0:
            self.log("val_acc", 1.0, sync_dist=True)  # expect: LX101
