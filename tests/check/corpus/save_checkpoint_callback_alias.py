"""A Callback saves a checkpoint on rank 0 only, through an alias of the module's trainer and a guard alias."""

import os

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    pass


class ManualSaver(Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        owner = pl_module.trainer
        is_zero = owner.is_global_zero
        if is_zero and not owner.sanity_checking:
            owner.save_checkpoint(os.path.join(owner.default_root_dir, "best.ckpt"))  # expect: LX202
