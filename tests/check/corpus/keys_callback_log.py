"""A Callback logs a synced key that names the rank; and a dict comprehension whose keys do."""

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

RUN = {}


class Model(BoringModel):
    pass


class RankLoss(Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        pl_module.log("val_loss_rank" + str(trainer.global_rank), 1.0, sync_dist=True)  # expect: LX103


class Shards(Callback):
    def on_test_epoch_end(self, trainer, pl_module):
        rank = trainer.global_rank
        pl_module.log_dict({f"{name}_{rank}": 1.0 for name in ("a", "b")}, sync_dist=True)  # expect: LX103
