"""A Callback hook decorated with @rank_zero_only that logs with sync_dist=True (the hook's arguments renamed)."""

import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities import rank_zero_only

RUN = {}


class Model(BoringModel):
    pass


class EpochReporter(pl.Callback):
    @rank_zero_only
    def on_train_epoch_end(self, the_trainer, module):
        module.log("epoch_report", 1.0, sync_dist=True)  # expect: LX101
