"""Correct: a helper with a collective, called on every rank; a rank_zero_only helper with no collective."""

from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities import rank_zero_only


class Model(BoringModel):
    def on_validation_epoch_end(self):
        self._sync()
        if self.trainer.is_global_zero:
            self._print_summary()

    def _sync(self):
        self.trainer.strategy.barrier()

    @rank_zero_only
    def _print_summary(self):
        print("validation done")
