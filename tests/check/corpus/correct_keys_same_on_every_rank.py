"""Correct: synced keys that every rank logs alike; a key naming the rank is fine when it is not synced."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.log_dict({f"val_{name}": loss for name in ("loss", "score")}, sync_dist=True)
        self.log(f"val_loss_rank{self.global_rank}", loss)
        self.log(f"val_loss_on_{self.global_rank}", loss, sync_dist=True, rank_zero_only=True)
        self.log("val_loss_scaled", loss * self.global_rank, sync_dist=True)
        return loss
