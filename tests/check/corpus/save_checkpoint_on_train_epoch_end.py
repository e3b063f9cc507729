"""trainer.save_checkpoint under `if self.trainer.is_global_zero:`: it waits at a barrier that only rank 0 reaches."""

import os

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def on_train_epoch_end(self):
        if self.trainer.is_global_zero:
            self.trainer.save_checkpoint(os.path.join(self.trainer.default_root_dir, "manual.ckpt"))  # expect: LX202
