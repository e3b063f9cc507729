"""The README's log_dir pitfall: trainer.log_dir (a broadcast) under `if self.trainer.is_global_zero:`."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        if self.trainer.is_global_zero:
            print(self.trainer.log_dir)  # expect: LX201
        return super().training_step(batch, batch_idx)
