"""A Callback's barrier under a rank guard inside a `with` block, in on_test_epoch_end."""

import contextlib

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {"stage": "test"}


class Model(BoringModel):
    pass


class Sync(Callback):
    def on_test_epoch_end(self, trainer, pl_module):
        with contextlib.suppress(FileNotFoundError):
            if trainer.global_rank == 0:
                trainer.strategy.barrier("after rank 0's files")  # expect: LX203
