"""A Callback gathers through the strategy and through the module on rank 0 only."""

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    pass


class Gather(Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            trainer.strategy.all_gather(pl_module.layer.weight)  # expect: LX204

    def on_test_epoch_end(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        pl_module.all_gather(pl_module.layer.weight)  # expect: LX204
