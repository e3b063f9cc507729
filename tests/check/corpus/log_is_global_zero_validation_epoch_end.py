"""The README's first pitfall: a synced self.log under `if self.trainer.is_global_zero:` in on_validation_epoch_end."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            self.log("val_acc", 1.0, sync_dist=True)  # expect: LX101
