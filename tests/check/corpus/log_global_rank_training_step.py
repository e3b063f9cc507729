"""A synced self.log under `if self.global_rank == 0:` in training_step (a step value: it syncs when logged)."""

import lightning as L
import torch

RUN = {}


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).sum()
        if self.global_rank == 0:
            self.log("rank_zero_loss", loss, sync_dist=True)  # expect: LX101
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(64, 32), batch_size=2)
