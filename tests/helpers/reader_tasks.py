"""Every reader of the synced values, under stock ``DDPStrategy`` and under lightning-ext (rank pools).

A callback logs synced values in ``on_train_batch_end`` (step values, a mean and a max), ``on_validation_batch_end``
(a step value and an epoch value), ``on_train_epoch_end`` and ``on_validation_epoch_end``, with a different value on
each rank; the module logs in the same hooks and in ``training_step``. The readers: a callback that reads
``callback_metrics``, ``logged_metrics`` and ``progress_bar_metrics`` in each of those hooks, ``ModelCheckpoint`` and
``EarlyStopping`` monitoring the callback's and the module's keys (their kept checkpoints, scores and stops), the
loggers (rank 0's ``metrics.csv``) and what the trainer shows at the end. ``order`` puts the logging callback first
(the readers see what it logged in the same hook) or last (they see the values of the batch or epoch before).

The values are multiples of 1/4 below 8: every sum of them is exact in any order, so each reader must show stock's
value bit for bit at any world size.
"""

from __future__ import annotations

import csv
import math
import os
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

EPOCHS, TRAIN_BATCHES, VAL_BATCHES = 3, 3, 2
HOOKS = ("on_train_batch_end", "on_validation_batch_end", "on_train_epoch_end", "on_validation_epoch_end")


def value(rank: int, key: str, step: int) -> torch.Tensor:
    """Rank ``rank``'s value of ``key`` at ``step`` (a batch or an epoch): a multiple of 1/4 below 8."""
    seed = sum(map(ord, key))
    return torch.tensor(((rank * 5 + step * 3 + seed) % 32) / 4.0)


class Logging(L.Callback):
    """Logs synced values of its own in four hooks, a different one on each rank."""

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        module.log("cb_train", value(module.global_rank, "cb_train", step), sync_dist=True, prog_bar=True)
        module.log("cb_train_max", value(module.global_rank, "max", step), sync_dist=True, reduce_fx="max")

    def on_validation_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step * 10 + batch_idx
        rank = module.global_rank
        module.log("cb_val_step", value(rank, "cb_val_step", step), sync_dist=True, on_step=True, on_epoch=False)
        module.log("cb_val", value(rank, "cb_val", step), sync_dist=True)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        module.log("cb_train_epoch", value(module.global_rank, "cb_train_epoch", trainer.current_epoch), sync_dist=True)

    def on_validation_epoch_end(self, trainer: Any, module: Any) -> None:
        rank, epoch = module.global_rank, trainer.current_epoch
        module.log("cb_val_epoch", value(rank, "cb_val_epoch", epoch), sync_dist=True, reduce_fx="max")


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {name: math.nan if number is None else float(number) for name, number in metrics.items()}


class Reading(L.Callback):
    """What the trainer shows in each of the hooks, from a callback."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, dict[str, float], dict[str, float], dict[str, float]]] = []

    def _read(self, hook: str, trainer: Any) -> None:
        shown = (trainer.callback_metrics, trainer.logged_metrics, trainer.progress_bar_metrics)
        self.reads.append((hook, *(_numbers(metrics) for metrics in shown)))

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        self._read("on_train_batch_end", trainer)

    def on_validation_batch_end(self, trainer: Any, *args: Any) -> None:
        self._read("on_validation_batch_end", trainer)

    def on_train_epoch_end(self, trainer: Any, *args: Any) -> None:
        self._read("on_train_epoch_end", trainer)

    def on_validation_epoch_end(self, trainer: Any, *args: Any) -> None:
        self._read("on_validation_epoch_end", trainer)


class Module(L.LightningModule):
    """Logs synced values of its own in ``training_step`` and in the four hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("m_step", value(self.global_rank, "m_step", self.global_step), sync_dist=True)
        return self.layer(batch[0]).sum() * 0.0

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.log("m_train", value(self.global_rank, "m_train", self.global_step), sync_dist=True, reduce_fx="min")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("m_val_step", value(self.global_rank, "m_val_step", batch_idx), sync_dist=True, on_step=True)

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.log("m_val", value(self.global_rank, "m_val", self.global_step + batch_idx), sync_dist=True)

    def on_train_epoch_end(self) -> None:
        self.log("m_train_epoch", value(self.global_rank, "m_train_epoch", self.current_epoch), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self.log("m_val_epoch", value(self.global_rank, "m_val_epoch", self.current_epoch), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _monitors(root: str) -> list[L.Callback]:
    directory = os.path.join(root, "checkpoints")
    return [
        ModelCheckpoint(
            dirpath=directory, monitor="cb_train", mode="max", every_n_train_steps=1, save_top_k=2,
            filename="train-{step}-{cb_train:.2f}",
        ),
        ModelCheckpoint(dirpath=directory, monitor="cb_val_epoch", mode="min", save_top_k=1, filename="val-{epoch}"),
        ModelCheckpoint(
            dirpath=directory, monitor="m_val_epoch", mode="max", save_top_k=2, filename="m-{epoch}-{m_val_epoch:.2f}"
        ),
        EarlyStopping(monitor="cb_val", mode="max", patience=1),
        EarlyStopping(monitor="cb_train_epoch", mode="min", patience=1, check_on_train_epoch_end=True),
    ]  # fmt: skip


def _state(callback: L.Callback) -> dict[str, Any]:
    """What a monitoring callback decided: the kept checkpoints and scores, or the stop's state."""
    if isinstance(callback, ModelCheckpoint):
        kept = {os.path.basename(path): float(score) for path, score in callback.best_k_models.items()}
        best = None if callback.best_model_score is None else float(callback.best_model_score)
        return {"kept": kept, "best": best, "best_path": os.path.basename(callback.best_model_path)}
    assert isinstance(callback, EarlyStopping)
    return {"best": float(callback.best_score), "wait": callback.wait_count, "stopped": callback.stopped_epoch}


def fit(root: str, stock: bool, logging_first: bool) -> dict[str, Any]:
    """One fit on this pool's ranks; everything each reader saw, on this rank."""
    from lightning_ext import PolicyDDPStrategy

    reading, monitors = Reading(), _monitors(root)
    readers = [reading, *monitors]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=dist.get_world_size(),
        strategy="ddp" if stock else PolicyDDPStrategy(),
        max_epochs=EPOCHS,
        logger=CSVLogger(root, version=0),
        log_every_n_steps=1,
        callbacks=[Logging(), *readers] if logging_first else [*readers, Logging()],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    train = DataLoader(TensorDataset(torch.zeros(TRAIN_BATCHES, 2)), batch_size=1)
    val = DataLoader(TensorDataset(torch.zeros(VAL_BATCHES, 2)), batch_size=1)
    trainer.fit(Module(), train, val)
    rows: list[dict[str, str]] = []
    if trainer.is_global_zero:
        with open(os.path.join(root, "lightning_logs", "version_0", "metrics.csv"), newline="") as file:
            rows = list(csv.DictReader(file))
    return {
        "reads": reading.reads,
        "monitors": [_state(callback) for callback in monitors],
        "callback_metrics": _numbers(trainer.callback_metrics),
        "logged_metrics": _numbers(trainer.logged_metrics),
        "progress_bar_metrics": _numbers(trainer.progress_bar_metrics),
        "csv": rows,
        "epochs": trainer.current_epoch,
    }
