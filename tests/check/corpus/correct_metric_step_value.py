"""Correct: a metric logged under a guard in training_step as a step value only (the default there): a step value of
a metric is its batch value, not computed across the ranks, so nothing syncs."""

from lightning.pytorch.demos.boring_classes import BoringModel
from torchmetrics import MeanMetric

RUN = {}


class Model(BoringModel):
    def __init__(self):
        super().__init__()
        self.train_mean = MeanMetric()

    def training_step(self, batch, batch_idx):
        output = super().training_step(batch, batch_idx)
        self.train_mean(output["loss"])
        if self.trainer.is_global_zero:
            self.log("train_mean", self.train_mean)
        return output
