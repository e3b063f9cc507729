"""An alias of the guard itself: `is_zero = self.trainer.is_global_zero`, then `if not is_zero: ... else: ...`."""

from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def on_test_epoch_end(self):
        is_zero = self.trainer.is_global_zero
        if not is_zero:
            pass
        else:
            self.log("test_acc", 1.0, sync_dist=True)  # expect: LX101
