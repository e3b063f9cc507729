"""self.all_gather under a rank guard in on_train_batch_end, with hang_checks="debug" (the README's option).

At run time today (a gap of the hang checks, not of this check): at the first batch, the other ranks go on into the
next step's DDP forward, whose bucket rebuild is a collective no check sees; the run ends in the stall report
(stall_timeout=10 here, so that it ends soon). tests/check/test_agreement.py marks it.
"""

from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {"strategy": {"hang_checks": "debug", "stall_timeout": 10}}


class Model(BoringModel):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.trainer.is_global_zero:
            gathered = self.all_gather(outputs["loss"])  # expect: LX204
            print(gathered)
