"""Correct: rank 0 writes under the guard, then every rank meets at the barrier after it."""

import os

from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def on_train_epoch_end(self):
        path = os.path.join(self.trainer.default_root_dir, "marker.txt")
        if self.trainer.is_global_zero:
            with open(path, "w") as handle:
                handle.write("ready")
        self.trainer.strategy.barrier()
