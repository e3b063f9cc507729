"""self.all_gather under a rank guard in validation_step (caught without hang_checks="debug" in this hook)."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        if self.trainer.is_global_zero:
            self.all_gather(loss)  # expect: LX204
        return loss
