"""strategy.barrier() under a rank guard in training_step."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        if self.trainer.is_global_zero:
            self.trainer.strategy.barrier()  # expect: LX203
        return super().training_step(batch, batch_idx)
