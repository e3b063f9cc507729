"""Correct: every rank gathers; rank 0 uses the result. A branch on the gathered value is the same on every rank."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        gathered = self.all_gather(loss * (self.global_rank + 1))
        if self.trainer.is_global_zero:
            print(gathered.mean())
        if gathered.sum() > 0:
            self.log("val_gathered", gathered.mean(), sync_dist=True)
        return loss
