"""Correct: a Callback writes on rank 0 and logs on every rank; a logger's methods under the guard."""

import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    pass


class Notes(pl.Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        pl_module.log("val_note", 1.0, sync_dist=True)
        if trainer.is_global_zero and trainer.logger is not None:
            trainer.logger.log_metrics({"note": 1.0}, step=trainer.global_step)
