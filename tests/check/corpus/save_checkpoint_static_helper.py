"""A static method given the trainer, called under a rank guard: its save_checkpoint runs on rank 0 only."""

import os

from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def on_train_epoch_end(self):
        if self.trainer.is_global_zero:
            self._save(self.trainer, "manual.ckpt")

    @staticmethod
    def _save(trainer, name):
        trainer.save_checkpoint(os.path.join(trainer.default_root_dir, name))  # expect: LX202
