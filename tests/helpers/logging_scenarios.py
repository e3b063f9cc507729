"""Real ``Trainer.fit`` runs that log a scripted set of metrics, for the per-rank metrics tests (run in rank pools).

A *script* says what each rank logs at each (epoch, batch): value, batch size, and the ``self.log`` options. The
parent computes the expected local and synced values from the same script and compares them with the files.
"""

from __future__ import annotations

import os
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torchmetrics
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.helpers.collectives import count_collectives
from lightning_ext import PolicyDDPStrategy


class ScriptedModule(L.LightningModule):
    """Logs, in ``training_step``, what ``script["train"]`` says; in ``validation_step``, ``script["val"]``.

    Each entry: ``{"name", "options": {...self.log kwargs}, "values": [rank][epoch][batch],
    "batch_sizes": [rank][epoch][batch] or None, "kind": "tensor" | "torchmetric"}``.
    """

    def __init__(self, script: dict[str, list[dict[str, Any]]]) -> None:
        super().__init__()
        self.script = script
        self.layer = torch.nn.Linear(2, 1)
        self.metrics = torch.nn.ModuleDict(
            {
                entry["name"]: torchmetrics.MeanMetric()
                for entries in script.values()
                for entry in entries
                if entry.get("kind") == "torchmetric"
            }
        )

    def _log_script(self, stage: str, batch_idx: int, dataloader_idx: int = 0) -> None:
        rank, epoch = self.global_rank, self.current_epoch
        for entry in self.script.get(stage, []):
            if entry.get("dataloader_idx", 0) != dataloader_idx:
                continue
            value = entry["values"][rank][epoch][batch_idx]
            options = dict(entry["options"])
            if entry["batch_sizes"] is not None:
                options["batch_size"] = entry["batch_sizes"][rank][epoch][batch_idx]
            if entry.get("kind") == "torchmetric":
                metric = self.metrics[entry["name"]]
                metric.update(torch.tensor(value), weight=options.pop("batch_size", 1))
                self.log(entry["name"], metric, **options)
            else:
                self.log(entry["name"], torch.tensor(value, dtype=torch.float32), **options)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._log_script("train", batch_idx)
        return self.layer(batch[0]).sum() * 0.0

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log_script("val", batch_idx, dataloader_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _loader(batches: int, world: int) -> DataLoader:
    # the DistributedSampler gives each rank `batches` batches of one sample
    return DataLoader(TensorDataset(torch.zeros(batches * world, 2)), batch_size=1)


def make_loggers(spec: str, root: str) -> Any:
    if spec == "csv":
        return CSVLogger(root)
    if spec == "tensorboard":
        return TensorBoardLogger(root)
    if spec == "several":
        return [TensorBoardLogger(root, name="tb"), CSVLogger(root, name="csv")]
    if spec == "none":
        return False
    raise ValueError(spec)


def fit(
    root: str,
    script: dict[str, list[dict[str, Any]]],
    *,
    strategy: Any = None,
    loggers: str = "csv",
    epochs: int = 2,
    batches: int = 2,
    val_dataloaders: int = 1,
    count: bool = False,
    checkpoint_every_epoch: bool = False,
    checkpoint_every_n_steps: int | None = None,
    max_steps: int = -1,
    ckpt_path: str | None = None,
    version: Any = None,
) -> dict[str, Any]:
    """Fit on this rank; returns the log directory, what the trainer saw, and optionally collective counts.

    ``checkpoint_every_epoch`` keeps every epoch's checkpoint and ``last.ckpt``; ``checkpoint_every_n_steps`` keeps a
    checkpoint every that many training steps (``epoch=E-step=S.ckpt``, mid-epoch). Both write to ``<root>/ckpt``.
    """
    world = dist.get_world_size()
    if strategy == "stock":
        chosen: Any = "ddp"
    else:
        chosen = PolicyDDPStrategy(**(strategy or {"per_rank_metrics": True}))
    logger = make_loggers(loggers, root)
    if version is not None and logger is not False:
        for each in logger if isinstance(logger, list) else [logger]:
            each._version = version
    callbacks = []
    if checkpoint_every_epoch:
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(root, "ckpt"), save_last=True, save_top_k=-1))
    if checkpoint_every_n_steps is not None:
        every = ModelCheckpoint(
            dirpath=os.path.join(root, "ckpt"), every_n_train_steps=checkpoint_every_n_steps, save_top_k=-1
        )
        callbacks.append(every)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=chosen,
        max_epochs=epochs,
        logger=logger,
        log_every_n_steps=1,
        callbacks=callbacks,
        enable_checkpointing=bool(callbacks),
        max_steps=max_steps,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=root,
        deterministic=True,
    )
    val = [_loader(batches, world) for _ in range(val_dataloaders)] if script.get("val") else None
    with count_collectives() as counts:
        trainer.fit(ScriptedModule(script), _loader(batches, world), val, ckpt_path=ckpt_path)
    loggers_after = [type(each).__name__ for each in trainer.loggers]
    return {
        "rank": trainer.global_rank,
        "log_dir": trainer.log_dir,
        "logger_log_dirs": [getattr(each, "log_dir", None) for each in trainer.loggers],
        "loggers_after": loggers_after,
        "callback_metrics": {key: float(value) for key, value in trainer.callback_metrics.items()},
        "collectives": dict(counts) if count else None,
        "steps": trainer.global_step,
    }


def version_race(root: str, strategy: str) -> str:
    """Rank 0 resolves its CSVLogger version and creates the directory before rank 1 starts (Lightning #18294)."""
    logger = CSVLogger(root)
    if dist.get_rank() == 0:
        os.makedirs(logger.log_dir, exist_ok=True)
    dist.barrier()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=dist.get_world_size(),
        strategy="ddp" if strategy == "stock" else PolicyDDPStrategy(per_rank_metrics=True),
        max_epochs=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(ScriptedModule({}), _loader(1, dist.get_world_size()))
    return str(logger.log_dir)


# ---- the script of every logging feature, shared by the per-rank runs and the native rerun ---------------------------
EPOCHS, BATCHES = 2, 3


def values(world: int, offset: float) -> list[list[list[float]]]:
    """Distinct, exactly representable values per rank, epoch and batch."""
    return [
        [[offset + 8 * rank + 2 * epoch + 0.25 * batch for batch in range(BATCHES)] for epoch in range(EPOCHS)]
        for rank in range(world)
    ]


def sizes(world: int) -> list[list[list[int]]]:
    # the same on every rank: these runs are compared with stock Lightning, whose synced weighted mean is only right
    # then (tests/strategies/test_synced_means.py)
    return [[[1 + (epoch + batch) % 3 for batch in range(BATCHES)] for epoch in range(EPOCHS)] for _ in range(world)]


def full_script(world: int) -> dict[str, list[dict[str, Any]]]:
    """Every logging feature: sync on/off, mean (batch-weighted)/sum/max/min, step/epoch, torchmetrics,
    rank_zero_only, and two validation dataloaders (index suffixes)."""

    def entry(name: str, offset: float, sized: bool = False, **options: Any) -> dict[str, Any]:
        return {
            "name": name,
            "options": options,
            "values": values(world, offset),
            "batch_sizes": sizes(world) if sized else None,
        }

    train = [
        entry("loss", 0.0, sized=True, on_step=True, on_epoch=True, sync_dist=False),
        entry("loss_sync", 1.0, sized=True, on_step=True, on_epoch=True, sync_dist=True),
        entry("total", 2.0, on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True),
        entry("peak", 3.0, on_step=False, on_epoch=True, reduce_fx="max", sync_dist=True),
        entry("low", 4.0, on_step=False, on_epoch=True, reduce_fx="min", sync_dist=False),
        entry("only_step", 5.0, on_step=True, on_epoch=False, sync_dist=True),
        entry("zero_only", 6.0, on_step=False, on_epoch=True, rank_zero_only=True),
        dict(entry("tm", 7.0, sized=True, on_step=False, on_epoch=True, sync_dist=True), kind="torchmetric"),
    ]
    val = [
        dict(entry("val_loss", 10.0, on_step=False, on_epoch=True), dataloader_idx=0, dataloaders=2),
        dict(entry("val_loss", 11.0, on_step=False, on_epoch=True, sync_dist=True), dataloader_idx=1, dataloaders=2),
    ]
    return {"train": train, "val": val}
