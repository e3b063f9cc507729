"""Real ``Trainer.fit`` runs for the rank pools: a tiny model whose validation metric each rank reads from a table.

The ranks of a :class:`tests.helpers.pool.RankPool` carry ``LOCAL_RANK``/``WORLD_SIZE``, so Lightning sees an externally
launched job and reuses the pool's process group: ``Trainer(devices=W, strategy=...)`` runs on every rank at once,
exactly as under ``torchrun``. Each rank returns what it ended with, for the parent to compare.
"""

from __future__ import annotations

import contextlib
import errno
import os
import unittest.mock
import warnings
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_ext import DecisionRecordWarning, PolicyDDPStrategy, read_decisions


class TableModule(L.LightningModule):
    """Logs ``val_loss`` = ``table[rank][epoch]``, un-synced, so ranks see different values."""

    def __init__(
        self,
        table: list[list[float | None]],
        sync_dist: bool = False,
        log_on: str = "all",
        train_table: list[list[float]] | None = None,
    ) -> None:
        super().__init__()
        self.table = table
        self.sync_dist = sync_dist
        self.log_on = log_on
        self.train_table = train_table
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train_loss", loss)
        if self.train_table is not None and (self.log_on != "rank_zero" or self.trainer.is_global_zero):
            row = self.train_table[self.trainer.global_rank]
            self.log("train_metric", torch.tensor(row[min(self.global_step, len(row) - 1)]))  # on_step, un-synced
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        rank, epoch = self.trainer.global_rank, self.current_epoch
        value = self.table[rank][min(epoch, len(self.table[rank]) - 1)]
        if self.log_on == "none":
            return
        if self.log_on == "rank_zero":  # the classic mistake: only rank 0 logs the monitored metric
            if self.trainer.is_global_zero:
                self.log("val_loss", torch.tensor(value), rank_zero_only=True)
            return
        if value is not None:
            self.log("val_loss", torch.tensor(value), sync_dist=self.sync_dist)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class RecordingCheckpoint(ModelCheckpoint):
    """A user's own subclass: records every checkpoint it saves (on every rank), otherwise stock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.saves: list[str] = []

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        self.saves.append(os.path.basename(filepath))
        super()._save_checkpoint(trainer, filepath)


class MarginCheckpoint(RecordingCheckpoint):
    """A user's own top-k rule: a checkpoint must beat the k-th best by a margin (min mode)."""

    def check_monitor_top_k(self, trainer: L.Trainer, current: torch.Tensor | None = None) -> bool:
        if current is None:
            return False
        if len(self.best_k_models) < self.save_top_k:
            return True
        decision = bool(current < self.best_k_models[self.kth_best_model_path] - 0.75)
        return trainer.strategy.reduce_boolean_decision(decision)


class FlakyCheckpoint(RecordingCheckpoint):
    """Rank 1's top-k rule answers with a string instead of a bool."""

    def check_monitor_top_k(self, trainer: L.Trainer, current: torch.Tensor | None = None) -> bool:
        if trainer.global_rank == 1:
            return "yes"  # type: ignore[return-value]
        return super().check_monitor_top_k(trainer, current)


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(8, 4, generator=generator)), batch_size=4)


def make_strategy(spec: Any) -> Any:
    """``"stock"`` → Lightning's ``DDPStrategy``; a dict → ``PolicyDDPStrategy(**dict)``; a str → a registry name."""
    if spec == "stock":
        return "ddp"
    if isinstance(spec, dict):
        return PolicyDDPStrategy(**spec)
    return spec


def fit(
    root: str,
    strategy: Any,
    table: list[list[float | None]],
    *,
    max_epochs: int = 6,
    checkpoint: dict[str, Any] | None = None,
    checkpoint_class: str = "RecordingCheckpoint",
    early_stopping: dict[str, Any] | None = None,
    sync_dist: bool = False,
    log_on: str = "all",
    train_table: list[list[float]] | None = None,
    logger: str | None = None,
    ckpt_path: str | None = None,
    full_disk_for: str | None = None,
) -> dict[str, Any]:
    """One ``Trainer.fit`` on this rank; returns the rank's view of the outcome.

    With ``logger`` (a directory or an fsspec URL), the trainer has a ``CSVLogger`` writing there (version ``v``), and
    rank 0 also returns the decision record read back (``record``) and the ``DecisionRecordWarning``s it got. With
    ``full_disk_for``, writing a file of that name fails as on a full disk (``ENOSPC``).
    """
    callbacks: list[Any] = []
    checkpoint_cb = early_cb = None
    if checkpoint is not None:
        checkpoint_cb = globals()[checkpoint_class](dirpath=os.path.join(root, "checkpoints"), **checkpoint)
        callbacks.append(checkpoint_cb)
    if early_stopping is not None:
        early_cb = EarlyStopping(**early_stopping)
        callbacks.append(early_cb)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=len(table or train_table or []),
        strategy=make_strategy(strategy),
        max_epochs=max_epochs,
        callbacks=callbacks,
        logger=False if logger is None else CSVLogger(logger, name="", version="v"),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        num_sanity_val_steps=0,
        deterministic=True,
    )
    module = TableModule(table, sync_dist=sync_dist, log_on=log_on, train_table=train_table)
    with warnings.catch_warnings(record=True) as caught, _full_disk(full_disk_for):
        warnings.simplefilter("always", DecisionRecordWarning)
        trainer.fit(module, _loader(), _loader() if table else None, ckpt_path=ckpt_path)
    result: dict[str, Any] = {
        "rank": trainer.global_rank,
        "strategy": type(trainer.strategy).__name__,
        "should_stop": trainer.should_stop,
        "current_epoch": trainer.current_epoch,
    }
    if checkpoint_cb is not None:
        result["saves"] = list(checkpoint_cb.saves)
        result["best_model_path"] = os.path.basename(checkpoint_cb.best_model_path)
        result["best_k_models"] = sorted(os.path.basename(path) for path in checkpoint_cb.best_k_models)
        result["kth_best_model_path"] = os.path.basename(checkpoint_cb.kth_best_model_path)
        result["last_model_path"] = os.path.basename(checkpoint_cb.last_model_path)
        result["best_model_score"] = (
            None if checkpoint_cb.best_model_score is None else float(checkpoint_cb.best_model_score)
        )
        directory = os.path.join(root, "checkpoints")
        # only rank 0 writes and deletes checkpoint files; another rank's listing would race with those deletions
        on_disk = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
        result["files"] = on_disk if trainer.is_global_zero else None
    if logger is not None and trainer.is_global_zero:
        result["record_warnings"] = [str(w.message) for w in caught if issubclass(w.category, DecisionRecordWarning)]
        try:
            with warnings.catch_warnings(record=True) as reading:
                warnings.simplefilter("always", DecisionRecordWarning)
                table = read_decisions(os.path.join(logger, "v") if "://" not in logger else f"{logger}/v")
            result["record"] = table.to_dict("records")
            result["read_warnings"] = [str(w.message) for w in reading]
        except FileNotFoundError as error:
            result["record"] = str(error)
    if early_cb is not None:
        result["stopped_epoch"] = early_cb.stopped_epoch
        reason = getattr(early_cb, "stopping_reason", None)  # Lightning 2.6+
        result["stopping_reason"] = None if reason is None else reason.name
        result["wait_count"] = early_cb.wait_count
        result["best_score"] = float(early_cb.best_score)
    return result


@contextlib.contextmanager
def _full_disk(name: str | None) -> Iterator[None]:
    """Within the block, writing a file called ``name`` fails with ``ENOSPC`` (its first write replaces it)."""
    if name is None:
        yield
        return
    replace = os.replace

    def full(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if os.path.basename(os.fspath(target)) == name:
            raise OSError(errno.ENOSPC, "No space left on device", os.fspath(target))
        replace(source, target, *args, **kwargs)

    with unittest.mock.patch.object(os, "replace", full):
        yield


# ---- the inputs several tests share: their expected outcomes were worked out by hand in those tests -------------
CKPT = {"monitor": "val_loss", "save_top_k": 1, "filename": "{epoch}-{val_loss:.2f}"}
# val_loss per rank (rows) and epoch (columns): checkpoint decisions, 3 ranks, save_top_k=1, mode=min
TABLE_3 = [
    [4.0, 3.0, 3.5, 2.0, 2.50],  # rank 0
    [4.0, 5.0, 3.5, 3.0, 2.25],  # rank 1
    [4.0, 5.0, 4.5, 6.0, 2.75],  # rank 2
]
# early stopping, patience=1 (a rank votes to stop at its first epoch without improvement)
ES_TABLE_3 = [
    [10.0, 9.0, 7.5, 8.5, 9.0],  # rank 0 votes stop at e3, e4
    [10.0, 11.0, 12.0, 7.0, 7.5],  # rank 1 votes stop at e1, e2, e4
    [10.0, 8.0, 9.0, 9.0, 8.5],  # rank 2 votes stop at e2, e3, e4
]
STEP_TABLE = [  # train_metric per global step (one step per epoch here), un-synced
    [4.0, 3.0, 3.5, 2.0, 2.5],
    [4.0, 5.0, 3.0, 3.0, 2.25],
]
STEP_CKPT = {"monitor": "train_metric", "every_n_train_steps": 1, "filename": "{step}-{train_metric:.2f}"}


def assert_agreed(results: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """Every rank ended with the same value of each of ``keys``."""
    for key in keys:
        values = [result[key] for result in results]
        assert all(value == values[0] for value in values), f"ranks disagree on {key}: {values}"
