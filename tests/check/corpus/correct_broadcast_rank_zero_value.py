"""Correct: rank 0 computes a value under the guard; every rank takes it from the broadcast after it."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        choice = "rank zero's choice" if self.trainer.is_global_zero else None
        choice = self.trainer.strategy.broadcast(choice)
        if choice is not None:
            self.log("chosen", 1.0, sync_dist=True)
