"""torch.distributed.gather_object on rank 0 only, in on_test_epoch_end (the call written with its full path)."""

import torch
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {"stage": "test"}


class Model(BoringModel):
    def on_test_epoch_end(self):
        if torch.distributed.get_rank() == 0:
            torch.distributed.gather_object("rank 0", [None, None])  # expect: LX205
