"""A Callback that logs through pl_module with sync_dist=True under `if trainer.is_global_zero:`."""

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    pass


class Reporter(Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            pl_module.log("val_report", 1.0, sync_dist=True)  # expect: LX101
