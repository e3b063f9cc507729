"""Correct: trainer.save_checkpoint on every rank (it writes on rank 0 itself)."""

import os

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    pass


class SaveEachEpoch(Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        trainer.save_checkpoint(os.path.join(trainer.default_root_dir, f"epoch{trainer.current_epoch}.ckpt"))
        if trainer.is_global_zero:
            print("saved")
