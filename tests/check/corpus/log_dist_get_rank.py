"""A synced self.log under `if dist.get_rank() == 0:` (torch.distributed's rank) in validation_step."""

import torch.distributed as dist
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        if dist.get_rank() == 0:
            self.log("val_loss", loss, sync_dist=True)  # expect: LX101
        return loss
