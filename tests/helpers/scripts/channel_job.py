"""One rank of a job across two hosts: network namespaces that the test created (tests/checks/test_channel.py).

Usage: ``python channel_job.py OUT SCENARIO``. The training group connects first, through ``GLOO_SOCKET_IFNAME``
as the test set it (the interface between the hosts: an NCCL job's training group finds its own network too); then
the scenario sets the variable for the hang checks' channel: ``auto`` (unset: the channel finds the route to
``MASTER_ADDR``) or ``lo`` (the loopback, which the other host cannot reach; ``lo_truncate`` with
``uneven_batches="truncate"``). Every rank writes ``OUT/outcome_<rank>.json``.
"""

import json
import os
import sys
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader

from lightning_ext import PolicyDDPStrategy
from lightning_ext._network import route_address

CHANNEL_TIMEOUT = 5.0


class Model(LightningModule):
    def __init__(self, pitfall: bool) -> None:
        super().__init__()
        self.pitfall = pitfall
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch).pow(2).mean()
        if self.pitfall and self.trainer.is_global_zero:
            self.log("loss", loss, sync_dist=True)  # the founding pitfall
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    out, scenario = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))  # through GLOO_SOCKET_IFNAME=xnet0
    if scenario == "auto":
        del os.environ["GLOO_SOCKET_IFNAME"]
    else:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    uneven = "truncate" if scenario == "lo_truncate" else "error"
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=2,
        strategy=PolicyDDPStrategy(check_channel_timeout=CHANNEL_TIMEOUT, uneven_batches=uneven),
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    outcome: dict[str, object] = {"error": None, "message": None}
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(Model(pitfall=scenario == "auto"), DataLoader(torch.randn(16, 4), batch_size=2))
        except Exception as error:
            outcome = {"error": type(error).__name__, "message": str(error)}
    outcome.update(
        rank=rank,
        seconds=time.monotonic() - started,
        global_step=trainer.global_step,
        warnings=[str(w.message) for w in caught if w.category.__name__ == "CheckChannelWarning"],
        route=route_address(os.environ["MASTER_ADDR"]),
    )
    with open(os.path.join(out, f"outcome_{rank}.json"), "w") as handle:
        json.dump(outcome, handle)
    sys.exit(0)


if __name__ == "__main__":
    main()
