"""A torch.distributed collective under a rank guard in on_validation_epoch_end."""

import torch
import torch.distributed as dist
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            dist.all_reduce(torch.ones(1))  # expect: LX205
