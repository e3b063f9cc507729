"""What ``ModelCheckpoint``/``EarlyStopping`` read from a trainer, and plain-data views of their state.

Shared by the rank-side tasks (:mod:`tests.helpers.decision_tasks`, which drive lightning_ext) and the single-process
reference (:mod:`tests.helpers.decision_reference`, which must not touch lightning_ext): nothing here imports
lightning_ext.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from benchmarks.helpers.stand_ins import StandInTrainer

CKPT_DIR = "/nonexistent/lightning-ext-ckpts"  # never written: the stand-in trainer only records the save
FILENAME = "{epoch}-{val_loss:.2f}-{acc:.3f}"


class StandInStrategy:
    """What the callbacks read from a strategy; its ``reduce_boolean_decision`` must never be reached."""

    def __init__(self, world_size: int, rank: int, checkpoint_policy: Any = None, early_stopping_policy: Any = None):
        self.world_size = world_size
        self.global_rank = rank
        self.root_device = torch.device("cpu")
        self.checkpoint_policy = checkpoint_policy
        self.early_stopping_policy = early_stopping_policy
        self.removed: list[str] = []

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        raise AssertionError(
            "the stock reduce_boolean_decision was reached: the policy path must make the only exchange"
        )

    def remove_checkpoint(self, filepath: str) -> None:
        self.removed.append(filepath)


def make_checkpoint(mode: str, save_top_k: int) -> ModelCheckpoint:
    return ModelCheckpoint(
        dirpath=CKPT_DIR,
        monitor="val_loss",
        mode=mode,
        save_top_k=save_top_k,
        filename=FILENAME,
        enable_version_counter=False,
    )


def tensor(value: float | None) -> torch.Tensor | None:
    return None if value is None else torch.tensor(value, dtype=torch.float32)


def candidates(epoch: int, value: float | None, acc: float | None) -> dict[str, torch.Tensor]:
    found = {"epoch": torch.tensor(epoch), "step": torch.tensor(10 * epoch)}
    if value is not None:
        found["val_loss"] = torch.tensor(value, dtype=torch.float32)
    if acc is not None:
        found["acc"] = torch.tensor(acc, dtype=torch.float32)
    return found


def checkpoint_state(callback: ModelCheckpoint, trainer: StandInTrainer) -> dict[str, Any]:
    """The callback's visible state, as plain data."""
    return {
        "best_k_models": {path: float(score) for path, score in callback.best_k_models.items()},
        "kth_best_model_path": callback.kth_best_model_path,
        "best_model_path": callback.best_model_path,
        "best_model_score": None if callback.best_model_score is None else float(callback.best_model_score),
        "saved": list(trainer.saved),
        "removed": list(trainer.strategy.removed),
    }


def make_early_stopping(config: dict[str, Any]) -> EarlyStopping:
    return EarlyStopping(monitor="val_loss", **config)


def early_stopping_state(callback: EarlyStopping) -> dict[str, Any]:
    reason = getattr(callback, "stopping_reason", None)  # Lightning 2.6+
    return {
        "best_score": float(callback.best_score),
        "wait_count": callback.wait_count,
        "stopping_reason": None if reason is None else reason.name,
    }
