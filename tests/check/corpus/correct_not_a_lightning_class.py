"""Correct as far as the check goes: only LightningModule and Callback subclasses (and what they call) are read; a
plain class and top-level code are not."""

import torch.distributed as dist


class Reporter:
    def __init__(self, trainer):
        self.trainer = trainer

    def report(self):
        if self.trainer.is_global_zero:
            self.trainer.save_checkpoint("report.ckpt")


def main(trainer):
    if dist.get_rank() == 0:
        dist.barrier()
