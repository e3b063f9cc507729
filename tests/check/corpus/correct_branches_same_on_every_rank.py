"""Correct: branches on values that are the same on every rank (epoch, step, batch index, world size)."""

import torch.distributed as dist
from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        output = super().training_step(batch, batch_idx)
        if batch_idx == 0:
            self.log("first_loss", output["loss"], sync_dist=True)
        if self.global_step % 2 == 0 and self.trainer.world_size > 1:
            self.log("even_loss", output["loss"], sync_dist=True)
        return output

    def on_train_epoch_end(self):
        if self.current_epoch % 2 == 0:
            self.trainer.strategy.barrier()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
