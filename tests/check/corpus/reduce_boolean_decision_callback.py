"""A Callback asks every rank's vote, with strategy.reduce_boolean_decision, on rank 0 only."""

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    pass


class Vote(Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            print(trainer.strategy.reduce_boolean_decision(True))  # expect: LX203
