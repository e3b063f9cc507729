"""A metric logged with on_epoch=True under a guard in training_step (computed, so synced, at the epoch's end);
rank_zero_only=True does not stop a metric's sync."""

import torchmetrics
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def __init__(self):
        super().__init__()
        self.train_mean = torchmetrics.aggregation.MeanMetric()

    def training_step(self, batch, batch_idx):
        output = super().training_step(batch, batch_idx)
        if self.global_rank == 0:
            self.train_mean(output["loss"])
            self.log("train_mean", self.train_mean, on_epoch=True, rank_zero_only=True)  # expect: LX102
        return output
