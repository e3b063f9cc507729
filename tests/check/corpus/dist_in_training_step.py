"""torch.distributed collectives under a rank guard in training_step and on_train_batch_end: found here; at run time
the other ranks go on into DDP's gradient all-reduce, and the stall report names the rank (not run: no error)."""

import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from torch import distributed
from torch.distributed import broadcast_object_list


class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 0:
            distributed.barrier()  # expect: LX205
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_rank == 0:
            broadcast_object_list([batch_idx])  # expect: LX205
        else:
            torch.distributed.all_reduce(outputs["loss"])  # expect: LX205
