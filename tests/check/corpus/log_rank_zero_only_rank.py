"""A guard on rank_zero_only.rank, the rank Lightning's rank_zero_* helpers read."""

from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.rank_zero import rank_zero_only

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        if rank_zero_only.rank == 0:
            self.log("val_acc", 1.0, sync_dist=True)  # expect: LX101
