"""Correct: the rank used as a value (a seed, a file name, a logged number), never to choose what runs."""

import os

import torch
from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def setup(self, stage):
        torch.manual_seed(1234 + self.global_rank)
        self.shard_file = os.path.join(self.trainer.default_root_dir, f"shard_{self.trainer.local_rank}.txt")

    def on_train_epoch_end(self):
        self.log("rank_as_value", float(self.global_rank), sync_dist=True, reduce_fx="max")
