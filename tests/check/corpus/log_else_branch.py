"""A synced self.log in the else branch of a rank guard: rank 0 prints, the other ranks sync."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            print("rank 0 is done with validation")
        else:
            self.log("val_acc", 1.0, sync_dist=True)  # expect: LX101
