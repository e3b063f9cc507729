"""A torchmetrics metric updated and logged on rank 0 only in validation_step: it syncs when computed."""

from lightning.pytorch.demos.boring_classes import BoringModel
from torchmetrics import MeanMetric

RUN = {}


class Model(BoringModel):
    def __init__(self):
        super().__init__()
        self.val_mean = MeanMetric()

    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        if self.trainer.is_global_zero:
            self.val_mean.update(loss)
            self.log("val_mean", self.val_mean)  # expect: LX102
        return loss
