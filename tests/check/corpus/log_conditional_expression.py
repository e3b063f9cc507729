"""Guards inside expressions: a conditional expression and `and`."""

from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def on_validation_epoch_end(self):
        self.log("val_acc", 1.0, sync_dist=True) if self.global_rank == 0 else None  # expect: LX101

    def on_test_epoch_end(self):
        self.trainer.is_global_zero and self.log("test_acc", 1.0, sync_dist=True)  # expect: LX101
