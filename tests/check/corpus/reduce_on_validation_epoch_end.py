"""strategy.reduce() under a rank guard in on_validation_epoch_end."""

import torch
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            total = self.trainer.strategy.reduce(torch.tensor(1.0), reduce_op="sum")  # expect: LX203
            print(total)
