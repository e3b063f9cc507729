"""`# noqa: CODE` silences that code on its line (`# noqa: A, B` both); a noqa of another code silences nothing."""

from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            self.log("val_acc", 1.0, sync_dist=True)  # noqa: LX101
            self.log("val_f1", 1.0, sync_dist=True)  # noqa: LX203  # expect: LX101
            self.trainer.strategy.barrier()  # noqa: LX101, LX203
