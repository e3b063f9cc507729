"""strategy.broadcast() under a rank guard in test_step, through `strategy = self.trainer.strategy`."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {"stage": "test"}


class Model(BoringModel):
    def test_step(self, batch, batch_idx):
        strategy = self.trainer.strategy
        if self.global_rank == 0:
            strategy.broadcast(batch_idx)  # expect: LX203
        return super().test_step(batch, batch_idx)
