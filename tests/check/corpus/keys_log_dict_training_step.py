"""The README's keys pitfall: self.log_dict with a key of each rank's own, synced (no guard needed)."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        output = super().training_step(batch, batch_idx)
        self.log_dict({f"part_{self.global_rank}": output["loss"]}, sync_dist=True)  # expect: LX103
        return output
