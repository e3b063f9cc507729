"""self.all_gather under a rank guard in training_step: the README says hang_checks="debug" for this hook."""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {"strategy": {"hang_checks": "debug"}}


class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        output = super().training_step(batch, batch_idx)
        if self.global_rank == 0:
            self.all_gather(output["loss"])  # expect: LX204
        return output
