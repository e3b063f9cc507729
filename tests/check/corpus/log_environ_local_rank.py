"""Guards that read the launcher's environment: os.environ.get("LOCAL_RANK"), int(os.environ["RANK"]), os.getenv."""

import os

from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def on_validation_epoch_end(self):
        if os.environ.get("LOCAL_RANK", "0") == "0":
            self.log("val_acc", 1.0, sync_dist=True)  # expect: LX101

    def on_test_epoch_end(self):
        if int(os.environ["RANK"]) == 0:
            self.log("test_acc", 1.0, sync_dist=True)  # expect: LX101

    def on_train_epoch_end(self):
        if os.getenv("SLURM_PROCID") == "0":
            self.trainer.save_checkpoint("last.ckpt")  # expect: LX202
