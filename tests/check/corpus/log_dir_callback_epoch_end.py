"""A Callback writes a file into trainer.log_dir on rank 0 only: reading log_dir is the collective."""

import os

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    pass


class SaveSummary(Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.global_rank == 0:
            path = os.path.join(trainer.log_dir, "summary.txt")  # expect: LX201
            with open(path, "w") as handle:
                handle.write("done")
