"""A synced self.log under a rank guard in on_train_batch_end, inside try/except.

At run time, at the first of two batches: the other rank goes on into the next step's DDP forward pass, whose bucket
rebuild (a broadcast from rank 0) cannot complete; the hang checks record that and name this line (before they did,
the run ended in the stall report: tests/check/test_agreement.py found it).
"""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {"strategy": {"stall_timeout": 10}}  # were it to stall, it would end soon


class Model(BoringModel):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        try:
            if self.trainer.is_global_zero:
                self.log("batch_loss", outputs["loss"], sync_dist=True)  # expect: LX101
        except KeyError:
            pass
