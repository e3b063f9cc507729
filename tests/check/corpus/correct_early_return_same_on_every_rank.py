"""Correct: an early return on a value that is the same on every rank guards nothing."""

from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx % 2:
            return
        self.log("even_batch_loss", outputs["loss"], sync_dist=True)
