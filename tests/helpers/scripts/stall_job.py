"""A user's training script in which rank 1 stalls at training batch 3, in a way no hang check can name.

Usage: ``python stall_job.py KIND STRATEGY LOG_DIR`` with STRATEGY ``ours`` (``PolicyDDPStrategy(stall_timeout=5)``;
``STALL_TIMEOUT=auto`` for the default) or ``stock`` (Lightning's ``DDPStrategy``); ``PG_TIMEOUT`` is the process
group's timeout in seconds (default 1800); ``LAUNCHER`` is ``popen`` (default), ``spawn`` or ``torchrun`` (one process
per node, ``NUM_NODES=2``). KIND:

* ``endless``: rank 1 computes forever in ``training_step``;
* ``collective_alone``: rank 1 calls ``torch.distributed.all_reduce`` on a group of every rank, which rank 0 never
  calls (rank 0 goes on into the backward pass);
* ``sigkill``: rank 1's process is killed (``SIGKILL``); ``sigkill_rank0``: rank 0's (under torchrun the agent holds
  the store; under Lightning's default launcher rank 0 holds it);
* ``stuck_worker``: rank 1's DataLoader worker never returns the batch;
* ``none``: nothing goes wrong.

Rank 1 writes ``LOG_DIR/stalled_1`` (the wall-clock time) when it stalls. Every rank that ends writes
``LOG_DIR/outcome_<rank>.json`` (``{"rank", "error", "message", "at"}``; under spawn, the launching process writes
``outcome_parent.json``). The stall report goes to ``LOG_DIR/run/stall_report.txt``.
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, Dataset

from lightning_ext import PolicyDDPStrategy

STALL_TIMEOUT = os.environ.get("STALL_TIMEOUT", "5")
PG_TIMEOUT = timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "1800")))
STALLING_RANK, STALLING_BATCH = 1, 3


def _rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def _mark(log_dir: str) -> None:
    with open(os.path.join(log_dir, f"stalled_{_rank()}"), "w") as handle:
        handle.write(str(time.time()))


class Numbers(Dataset):
    def __init__(self, kind: str, log_dir: str) -> None:
        self.kind, self.log_dir = kind, log_dir

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.kind == "stuck_worker" and _rank() == STALLING_RANK and index == 2 * STALLING_BATCH:
            _mark(self.log_dir)
            time.sleep(100_000)  # the worker never returns this batch
        return torch.full((4,), float(index))


class Stalling(LightningModule):
    def __init__(self, kind: str, log_dir: str) -> None:
        super().__init__()
        self.kind, self.log_dir = kind, log_dir
        self.layer = torch.nn.Linear(4, 1)
        self.extra_group = None

    def setup(self, stage: str) -> None:
        if self.kind == "collective_alone":
            self.extra_group = dist.new_group(backend="gloo")  # every rank creates it

    def train_dataloader(self) -> DataLoader:
        workers = 1 if self.kind == "stuck_worker" else 0
        return DataLoader(Numbers(self.kind, self.log_dir), batch_size=2, num_workers=workers)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if batch_idx == STALLING_BATCH and self.global_rank == STALLING_RANK:
            self._stall()
        if batch_idx == STALLING_BATCH and self.global_rank == 0 and self.kind == "sigkill_rank0":
            _mark(self.log_dir)
            os.kill(os.getpid(), signal.SIGKILL)
        return self.layer(batch).pow(2).mean()

    def _stall(self) -> None:
        if self.kind == "endless":
            _mark(self.log_dir)
            state = torch.rand(64, 64)
            while True:  # the computation never ends
                state = torch.tanh(state @ state)
                time.sleep(0.002)
        if self.kind == "collective_alone":
            _mark(self.log_dir)
            dist.all_reduce(torch.ones(1), group=self.extra_group)  # rank 0 never makes this call
        if self.kind == "sigkill":
            _mark(self.log_dir)
            os.kill(os.getpid(), signal.SIGKILL)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    kind, strategy_kind, log_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    launcher = os.environ.get("LAUNCHER", "popen")
    start_method = "spawn" if launcher == "spawn" else "popen"
    if strategy_kind == "stock":
        strategy: object = DDPStrategy(start_method=start_method, timeout=PG_TIMEOUT)
    else:
        stall_timeout = STALL_TIMEOUT if STALL_TIMEOUT == "auto" else float(STALL_TIMEOUT)
        strategy = PolicyDDPStrategy(start_method=start_method, timeout=PG_TIMEOUT, stall_timeout=stall_timeout)
    trainer = Trainer(
        accelerator="cpu",
        devices=2 if launcher != "torchrun" else 1,
        num_nodes=int(os.environ.get("NUM_NODES", "1")),
        strategy=strategy,
        max_epochs=1,
        logger=CSVLogger(log_dir, name="", version="run"),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,  # every rank reads every batch: rank 1 reaches batch 3 as rank 0 does
    )
    outcome: dict[str, object] = {"error": None, "message": None}
    try:
        trainer.fit(Stalling(kind, log_dir))
    except BaseException as error:
        outcome = {"error": type(error).__name__, "message": str(error)}
    rank = "parent" if launcher == "spawn" else trainer.global_rank
    outcome.update(rank=rank, at=time.time())
    with open(os.path.join(log_dir, f"outcome_{rank}.json"), "w") as handle:
        json.dump(outcome, handle)
    sys.exit(1 if outcome["error"] else 0)


if __name__ == "__main__":
    main()
