"""A launched DDP job that falls into one of the pitfalls that freeze Lightning jobs.

Usage: ``python hang_scenarios.py SCENARIO STRATEGY LOG_DIR`` with STRATEGY ``ours`` (PolicyDDPStrategy, default
checks), ``debug`` (``hang_checks="debug"``), ``truncate`` (``uneven_batches="truncate"``), ``off``
(``hang_checks=False``) or ``stock`` (Lightning's DDPStrategy). Set ``LAUNCHER`` to ``popen`` (default), ``spawn``
or ``torchrun`` (the script is then started by torchrun, one process per rank), and ``DEVICES`` (default 2).

Every rank writes ``LOG_DIR/outcome_<rank>.json``: ``{"rank": r, "error": class name or null, "message": ...,
"at": the wall-clock time it ended}`` (under spawn, the launching process writes ``outcome_parent.json``). A rank
that reaches the point of divergence first writes ``LOG_DIR/diverged_<rank>`` with the wall-clock time. A hang
writes no outcome; the test's timeout cuts it.
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torchmetrics import MeanMetric

from lightning_ext import PerRankMetrics, PolicyDDPStrategy

SCENARIOS = (
    "none",
    "uneven_train",
    "uneven_val",
    "uneven_iterable_train",
    "stream_short_on_last_rank",
    "log_on_rank_zero_epoch_end",
    "log_on_rank_zero_step",
    "log_dict_keys_differ",
    "metric_on_some_ranks",
    "log_dir_on_rank_zero",
    "save_checkpoint_on_rank_zero",
    "barrier_on_rank_zero",
    "broadcast_on_rank_zero",
    "all_gather_on_rank_zero",
    "all_gather_on_rank_zero_in_validation",
    "sigterm_on_one_rank",
    "rank_raises",
)


class Numbers(Dataset):
    """``length`` samples of 4 features; the length may depend on the rank (uneven shards)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((4,), float(index))


class Stream(IterableDataset):
    """``length`` samples without ``__len__`` (a stream, a sharded IterableDataset)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (torch.full((4,), float(index)) for index in range(self.length))


class Pitfall(LightningModule):
    def __init__(self, scenario: str, log_dir: str) -> None:
        super().__init__()
        self.scenario = scenario
        self.log_dir_for_ckpt = log_dir
        self.diverged = False
        self.layer = torch.nn.Linear(4, 1)
        self.metric = MeanMetric()

    def _diverge(self) -> None:
        """Record when this rank reaches the point where the ranks part ways."""
        if not self.diverged:
            self.diverged = True
            with open(os.path.join(self.log_dir_for_ckpt, f"diverged_{self.trainer.global_rank}"), "w") as handle:
                handle.write(repr(time.time()))

    def _data(self, stage: str) -> DataLoader:
        rank = self.trainer.global_rank
        length = 8
        if self.scenario == "uneven_train" and stage == "train":
            length = 8 + 4 * rank
            self._diverge()
        if self.scenario == "uneven_val" and stage == "val":
            length = 4 + 4 * rank
            self._diverge()
        if self.scenario == "uneven_iterable_train" and stage == "train":
            self._diverge()
            return DataLoader(Stream(8 + 4 * rank), batch_size=2)
        if self.scenario == "stream_short_on_last_rank" and stage == "train":
            self._diverge()
            return DataLoader(Stream(8 if rank == self.trainer.world_size - 1 else 12), batch_size=2)
        return DataLoader(Numbers(length), batch_size=2)

    def train_dataloader(self) -> DataLoader:
        return self._data("train")

    def val_dataloader(self) -> DataLoader:
        return self._data("val")

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch).pow(2).mean()
        self.log("train_loss", loss, sync_dist=True)
        rank = self.trainer.global_rank
        guarded = ("log_on_rank_zero_step", "log_dir_on_rank_zero", "barrier_on_rank_zero", "broadcast_on_rank_zero")
        if self.scenario in (*guarded, "all_gather_on_rank_zero") and self.trainer.is_global_zero and batch_idx == 1:
            self._diverge()
        if self.scenario == "log_dict_keys_differ" or (self.scenario == "rank_raises" and rank == 1 and batch_idx == 2):
            self._diverge()
        if self.scenario == "log_on_rank_zero_step" and self.trainer.is_global_zero and batch_idx == 1:
            self.log("rank_zero_only_loss", loss, sync_dist=True)
        if self.scenario == "log_dict_keys_differ":
            self.log_dict({f"part_{rank}": loss}, sync_dist=True)
        if self.scenario == "log_dir_on_rank_zero" and self.trainer.is_global_zero and batch_idx == 1:
            print(self.trainer.log_dir)
        if self.scenario == "barrier_on_rank_zero" and self.trainer.is_global_zero and batch_idx == 1:
            self.trainer.strategy.barrier()
        if self.scenario == "broadcast_on_rank_zero" and self.trainer.is_global_zero and batch_idx == 1:
            self.trainer.strategy.broadcast(batch_idx)
        if self.scenario == "all_gather_on_rank_zero" and self.trainer.is_global_zero and batch_idx == 1:
            self.all_gather(loss)
        if self.scenario == "rank_raises" and rank == 1 and batch_idx == 2:
            raise ValueError("boom on rank 1")
        if self.scenario == "sigterm_on_one_rank" and rank == 1 and batch_idx == 2:
            self._diverge()
            os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler's preemption notice to this rank alone
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        value = self.layer(batch).mean()
        on_step = self.scenario in ("uneven_val", "all_gather_on_rank_zero_in_validation")
        self.log("val_loss", value, sync_dist=True, on_step=on_step)
        if self.scenario == "all_gather_on_rank_zero_in_validation" and self.trainer.is_global_zero and batch_idx == 1:
            self._diverge()
            self.all_gather(value)
        if self.scenario == "metric_on_some_ranks" and self.trainer.is_global_zero:
            self._diverge()
            self.metric.update(value)
            self.log("val_mean", self.metric)

    def on_validation_epoch_end(self) -> None:
        if self.scenario == "log_on_rank_zero_epoch_end" and self.trainer.is_global_zero:
            self._diverge()
            self.log("val_acc", 1.0, sync_dist=True)

    def on_train_epoch_end(self) -> None:
        if self.scenario == "save_checkpoint_on_rank_zero" and self.trainer.is_global_zero:
            self._diverge()
            self.trainer.save_checkpoint(os.path.join(self.log_dir_for_ckpt, "manual.ckpt"))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _strategy(kind: str, launcher: str) -> object:
    start_method = "spawn" if launcher == "spawn" else "popen"
    if kind == "stock":
        return DDPStrategy(start_method=start_method)
    options: dict[str, dict[str, object]] = {"ours": {}, "off": {"hang_checks": False}}
    options["debug"] = {"hang_checks": "debug"}
    options["truncate"] = {"uneven_batches": "truncate"}
    options["unsized"] = {"check_unsized_loaders": True}
    options["unsized_truncate"] = {"check_unsized_loaders": True, "uneven_batches": "truncate"}
    options["no_stop"] = {"preemption_policy": None}  # a lone SIGTERM ends the run (tests/preemption/)
    # rows stay buffered (1000 > rows of a run) unless lightning-ext flushes them before its error
    per_rank = PerRankMetrics(flush_every_n_rows=1000)
    return PolicyDDPStrategy(start_method=start_method, per_rank_metrics=per_rank, **options[kind])


def main() -> None:
    scenario, kind, log_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    launcher = os.environ.get("LAUNCHER", "popen")
    trainer = Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("DEVICES", "2")) if launcher != "torchrun" else "auto",
        num_nodes=int(os.environ.get("NUM_NODES", "1")),
        strategy=_strategy(kind, launcher),
        max_epochs=2,
        log_every_n_steps=1,
        logger=CSVLogger(log_dir, name="", version="run"),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
    )
    started = time.monotonic()
    outcome: dict[str, object] = {"error": None, "message": None}
    try:
        trainer.fit(Pitfall(scenario, log_dir))
    except BaseException as error:
        outcome = {"error": type(error).__name__, "message": str(error)}
    rank = "parent" if launcher == "spawn" else trainer.global_rank
    outcome.update(rank=rank, at=time.time(), seconds=time.monotonic() - started)
    with open(os.path.join(log_dir, f"outcome_{rank}.json"), "w") as handle:
        json.dump(outcome, handle)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
