"""A synced self.log under `if self.trainer.node_rank == 0:` in test_step: on several nodes only node 0 syncs it."""

from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def test_step(self, batch, batch_idx):
        if self.trainer.node_rank == 0:
            self.log("test_loss", self.step(batch), sync_dist=True)  # expect: LX101
