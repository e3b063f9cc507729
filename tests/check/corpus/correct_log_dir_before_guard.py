"""Correct: every rank reads trainer.log_dir; only rank 0 writes into it. The logger's own log_dir is no collective."""

import os

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def on_train_epoch_end(self):
        log_dir = self.trainer.log_dir
        if self.trainer.is_global_zero:
            os.makedirs(log_dir, exist_ok=True)


class LoggerDir(Callback):
    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero and trainer.logger is not None:
            print(trainer.logger.log_dir)
