"""Correct: under the guard, values are logged with rank_zero_only=True (not synced) or without sync_dist."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            self.log("val_acc", 1.0, sync_dist=True, rank_zero_only=True)
            self.log("val_f1", 0.5, rank_zero_only=True)
            self.log("val_plain", 0.25)
            self.log("val_not_synced", 0.125, sync_dist=False)
