"""A guard kept on the module: `self.is_zero = self.trainer.is_global_zero` in setup, read in another hook."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def setup(self, stage):
        self.is_zero = self.trainer.is_global_zero

    def on_validation_epoch_end(self):
        if self.is_zero:
            self.log("val_acc", 1.0, sync_dist=True)  # expect: LX101
