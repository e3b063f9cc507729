"""A nested function that logs with sync_dist=True, called under the guard."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        def report(value):
            self.log("val_acc", value, sync_dist=True)  # expect: LX101

        if self.trainer.is_global_zero:
            report(1.0)
