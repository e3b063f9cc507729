"""Correct: printing, writing files and Lightning's rank_zero_info under rank guards are not collective."""

import os

from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only


class Model(BoringModel):
    def on_train_epoch_end(self):
        if self.trainer.is_global_zero:
            print("epoch", self.current_epoch)
            with open(os.path.join(self.trainer.default_root_dir, "epoch.txt"), "w") as handle:
                handle.write(str(self.current_epoch))
        rank_zero_info("epoch done")
        self._write_notes()

    @rank_zero_only
    def _write_notes(self):
        print("notes on rank 0")
