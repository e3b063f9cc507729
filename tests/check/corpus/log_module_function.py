"""A function of the same file, given the module, that logs with sync_dist=True; the hook calls it under the guard."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


def log_summary(module, value):
    module.log("val_summary", value, sync_dist=True)  # expect: LX101


class Model(BoringModel):
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            log_summary(self, 1.0)
