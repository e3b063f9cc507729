"""A user's training script that falls into the README's pitfalls, one fit (or test) after another in one launch.

Usage: ``python pitfall_matrix.py OUT_DIR DEVICES SCENARIO [SCENARIO ...]`` with each SCENARIO ``pitfall@place``,
followed by ``+debug`` for ``hang_checks="debug"``:

* pitfall: ``log`` (a synced ``self.log`` under ``if self.trainer.is_global_zero:``), ``metric`` (a torchmetrics metric
  updated and logged there), ``keys`` (``log_dict`` with a key of each rank's own, unguarded), ``log_dir``,
  ``save_checkpoint``, ``barrier``, ``broadcast``, ``all_gather``, ``all_reduce``, ``all_gather_single``
  (``torch.distributed``), each under
  the guard; or ``uneven`` (rank 0 has a batch more in the place's dataloader: ``train``, ``val``, ``test``,
  ``stream``: a train ``IterableDataset``);
* place: the hook (``training_step``, ``on_train_batch_end``, ``on_train_epoch_end``, ``validation_step``,
  ``on_validation_epoch_end``, ``test_step``, ``on_test_epoch_end``), or ``sanity:<hook>`` for a validation hook whose
  pitfall is reached in the sanity check (the validation hooks without it skip the sanity check), or
  ``first:<hook>`` for a training hook whose pitfall is reached at the first of 3 batches, with a BatchNorm layer (so
  that the other ranks go on into the next step's DDP forward pass, which broadcasts the buffers and, once, the
  rebuilt gradient buckets' order; elsewhere an epoch has one batch per rank).

The Trainer is the default one (sanity check, checkpointing and logger on) with ``PolicyDDPStrategy()``, under
Lightning's default launcher. Every rank runs every scenario in order and writes ``OUT_DIR/<scenario>.<rank>.json``
(``error``, ``message``, ``diverged``: when this rank reached the pitfall, ``ended``: when it raised). Between two
scenarios every rank leaves the process group and the next fit starts a new one (on the next port of ``PORTS``), so
a rank left blocked in a collective by one scenario is released before the next. Each rank says in the log which
scenario it starts, and writes every thread's Python stack to ``OUT_DIR/stacks.<rank>.txt`` on ``SIGUSR2`` (what the
test sends the job when no scenario has ended for a long time: a hang).
"""

import faulthandler
import gc
import json
import os
import signal
import sys
import time

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from torchmetrics import MeanMetric

from lightning_ext import PolicyDDPStrategy


class Stream(IterableDataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):  # type: ignore[no-untyped-def]
        return ((torch.full((4,), float(index)),) for index in range(self.length))


class Pitfalls(L.LightningModule):
    def __init__(self, pitfall: str, place: str, out: str) -> None:
        super().__init__()
        self.pitfall, self.place, self.out = pitfall, place, out
        self.first = place.startswith("first:")
        buffers = [torch.nn.BatchNorm1d(4)] if self.first else []  # broadcast by DDP at each forward pass
        self.layer = torch.nn.Sequential(*buffers, torch.nn.Linear(4, 1))
        self.metric = MeanMetric()
        self.diverged: float | None = None

    def _here(self, hook: str) -> bool:
        """Whether the pitfall is in ``hook`` and this is when it fires (in the sanity check or after it)."""
        if self.place.split(":")[-1] != hook:
            return False
        if self.first and self.trainer.fit_loop.epoch_loop.batch_idx != 0:
            return False
        return self.trainer.sanity_checking == self.place.startswith("sanity:")

    def _fall(self, hook: str) -> None:
        if not self._here(hook):
            return
        rank = self.trainer.global_rank
        if self.diverged is None:
            self.diverged = time.time()
        if self.pitfall == "keys":
            self.log_dict({f"part_{rank}": 1.0}, sync_dist=True)  # pitfall: keys
        if not self.trainer.is_global_zero:
            return
        if self.pitfall == "log":
            self.log("val_acc", 1.0, sync_dist=True)  # pitfall: log
        elif self.pitfall == "metric":
            self.metric.update(1.0)
            self.log("val_mean", self.metric)  # pitfall: metric
        elif self.pitfall == "log_dir":
            print(self.trainer.log_dir)  # pitfall: log_dir
        elif self.pitfall == "save_checkpoint":
            self.trainer.save_checkpoint(os.path.join(self.out, "manual.ckpt"))  # pitfall: save_checkpoint
        elif self.pitfall == "barrier":
            self.trainer.strategy.barrier()  # pitfall: barrier
        elif self.pitfall == "broadcast":
            self.trainer.strategy.broadcast(1)  # pitfall: broadcast
        elif self.pitfall == "all_gather":
            self.all_gather(torch.ones(1))  # pitfall: all_gather
        elif self.pitfall == "all_reduce":
            dist.all_reduce(torch.ones(1))  # pitfall: all_reduce
        elif self.pitfall == "all_gather_single":  # torch 2.13's name for all_gather_into_tensor
            dist.all_gather_single(torch.zeros(self.trainer.world_size), torch.ones(1))  # pitfall: all_gather_single

    def _loader(self, stage: str) -> DataLoader:
        rank, world = self.trainer.global_rank, self.trainer.world_size
        if self.pitfall == "uneven" and self.place == "stream" and stage == "train":
            return DataLoader(Stream(4 + 2 * min(rank, 1)), batch_size=2)  # rank 0: 2 batches, the others 3
        # rank 0's shard (the DistributedSampler's) has 3 batches of 2, the others' 1 batch, where this is uneven;
        # every rank's has 3 for a pitfall at the first training batch
        uneven = self.pitfall == "uneven" and self.place == stage and rank == 0
        size = 6 * world if self.first and stage == "train" else 4 + 4 * world * uneven
        return DataLoader(TensorDataset(torch.randn(size, 4)), batch_size=2)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        self._fall("training_step")
        return self.layer(batch[0]).pow(2).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        self._fall("on_train_batch_end")

    def on_train_epoch_end(self) -> None:
        self._fall("on_train_epoch_end")

    def validation_step(self, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        self._fall("validation_step")

    def on_validation_epoch_end(self) -> None:
        self._fall("on_validation_epoch_end")

    def test_step(self, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        self._fall("test_step")

    def on_test_epoch_end(self) -> None:
        self._fall("on_test_epoch_end")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run(scenario: str, out: str, devices: int) -> dict[str, object]:
    """One scenario: a default Trainer's fit (or test), expected to raise on every rank."""
    pitfall, place = scenario.removesuffix("+debug").split("@")
    root = os.path.join(out, scenario.replace(":", "-").replace("@", "-").replace("+", "-"))
    model = Pitfalls(pitfall, place, root)
    strategy = PolicyDDPStrategy(hang_checks="debug" if scenario.endswith("+debug") else True)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=1, default_root_dir=root)
    outcome: dict[str, object] = {"error": None, "message": None}
    try:
        if place.startswith("test") or place == "on_test_epoch_end":
            trainer.test(model)
        else:
            trainer.fit(model)
    except Exception as error:
        outcome = {"error": type(error).__name__, "message": str(error)}
    if pitfall == "uneven" and model.diverged is None:
        model.diverged = time.time()  # the loaders differ from the start
    return {**outcome, "diverged": model.diverged, "ended": time.time(), "rank": trainer.global_rank}


def dump_stacks_on_signal(stacks: object) -> None:
    """On SIGUSR2, write every thread's Python stack to ``stacks``, in C: a rank blocked in a collective (or holding
    the GIL) still answers. Again in every scenario: a fit's end gives every signal back the handler Python knew, the
    default here, which faulthandler's own ``register`` does not notice. (SIGUSR1 is Lightning's SLURM signal, which
    lightning-ext notes during a fit in a Python handler.)"""
    faulthandler.unregister(signal.SIGUSR2)
    faulthandler.register(signal.SIGUSR2, file=stacks, all_threads=True)


def main() -> None:
    out, devices, scenarios = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    ports = os.environ["PORTS"].split(",")
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # Lightning's launcher starts ranks 1, 2, ... with it set
    stacks = open(os.path.join(out, f"stacks.{rank}.txt"), "w")  # noqa: SIM115 (open for the whole job)
    for scenario, port in zip(scenarios, ports, strict=False):
        print(f"pitfall_matrix: rank {rank} starts {scenario}", flush=True)
        dump_stacks_on_signal(stacks)
        os.environ["MASTER_PORT"] = port
        cpu, started = time.process_time(), time.time()
        outcome = run(scenario, out, devices)
        dump_stacks_on_signal(stacks)  # and while it leaves the process group
        outcome["started"] = started
        outcome["cpu"] = time.process_time() - cpu  # this rank's CPU seconds in the scenario (what it costs a suite)
        with open(os.path.join(out, f"{scenario}.{outcome['rank']}.json"), "w") as handle:
            json.dump(outcome, handle)
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()  # the group's last references go (the DDP wrapper's): its connections close, which releases a
        # rank that the scenario left blocked in a collective (it then raises the same error)


if __name__ == "__main__":
    main()
