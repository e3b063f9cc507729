"""An early return on every rank but 0 guards the rest of the hook: the synced log after it runs on rank 0 only."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_train_epoch_end(self):
        if self.global_rank != 0:
            return
        print("summary on rank 0")
        self.log("epoch_summary", 1.0, sync_dist=True)  # expect: LX101
