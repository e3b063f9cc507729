"""A helper method that logs with sync_dist=True, called under the guard from a hook (followed one level deep)."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        if self.global_rank == 0:
            self._log_summary()

    def _log_summary(self):
        self.log("val_summary", 1.0, sync_dist=True)  # expect: LX101
