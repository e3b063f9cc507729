"""A synced self.log_dict in a method decorated with @rank_zero_only, called from on_validation_epoch_end."""

from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities import rank_zero_only

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        self._summary()

    @rank_zero_only
    def _summary(self):
        self.log_dict({"val_acc": 1.0, "val_f1": 0.5}, sync_dist=True)  # expect: LX101
