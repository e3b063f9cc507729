"""Functions that run inside the rank processes of a :class:`tests._pool.RankPool` (real gloo collectives).

Each takes plain, picklable arguments and returns plain results, so the parent can compare every rank's answer with a
single-process reference. The trainer stand-in below replaces only what a callback reads from a ``Trainer``; every
cross-rank exchange goes through ``torch.distributed`` for real.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from lightning_ext import _decisions as decisions
from lightning_ext._collective import RankGroup, all_reduce_row
from lightning_ext._exchange import Layout, Observation, pack, unpack
from lightning_ext._local_top_k import LocalTopK
from lightning_ext.policies import VotePolicy, VoteTally, resolve_policy

CKPT_DIR = "/nonexistent/lightning-ext-ckpts"  # never written: the stand-in trainer only records the save
FILENAME = "{epoch}-{val_loss:.2f}-{acc:.3f}"


class TwoThirds(VotePolicy):
    """A user's own vote policy: act when at least two thirds of the ranks vote for it."""

    def decide(self, tally: VoteTally) -> bool:
        return 3 * tally.yes >= 2 * tally.world_size

    def __repr__(self) -> str:
        return "TwoThirds()"


class UndecidedPolicy(VotePolicy):
    """A broken user policy: its decision is not a bool."""

    def decide(self, tally: VoteTally) -> bool:
        return None  # type: ignore[return-value]

    def __repr__(self) -> str:
        return "UndecidedPolicy()"


class StandInStrategy:
    """What the decision code reads from a strategy; its own reduce_boolean_decision must never be reached."""

    def __init__(self, world_size: int, rank: int, checkpoint_policy: Any = None, early_stopping_policy: Any = None):
        self.world_size = world_size
        self.global_rank = rank
        self.root_device = torch.device("cpu")
        self.checkpoint_policy = None if checkpoint_policy is None else resolve_policy(checkpoint_policy)
        self.early_stopping_policy = None if early_stopping_policy is None else resolve_policy(early_stopping_policy)
        self.removed: list[str] = []

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        raise AssertionError(
            "the stock reduce_boolean_decision was reached: the policy path must make the only exchange"
        )

    def remove_checkpoint(self, filepath: str) -> None:
        self.removed.append(filepath)


class StandInTrainer:
    """What ModelCheckpoint/EarlyStopping read from a trainer."""

    def __init__(self, strategy: StandInStrategy) -> None:
        self.strategy = strategy
        self.global_rank = strategy.global_rank
        self.is_global_zero = strategy.global_rank == 0
        self.loggers: list[Any] = []
        self.ckpt_path = None
        self.global_step = 0
        self.current_epoch = 0
        self.fast_dev_run = False
        self.should_stop = False
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self.saved: list[str] = []

    def save_checkpoint(self, filepath: str, weights_only: bool = False) -> None:
        self.saved.append(filepath)


def rank_group() -> RankGroup:
    if dist.is_available() and dist.is_initialized():
        return RankGroup(dist.get_world_size(), dist.get_rank(), torch.device("cpu"))
    return RankGroup(1, 0, torch.device("cpu"))


def exchange(kind: str, with_reference: bool, n_extras: int, observation: Observation) -> tuple[list[Any], Any]:
    """One packed all-reduce; returns the reduced row (to compare bit for bit across ranks) and the agreement."""
    ranks = rank_group()
    layout = Layout(kind, ranks.world_size, with_reference=with_reference, extras=n_extras)  # type: ignore[arg-type]
    reduced = all_reduce_row(pack(layout, observation, rank=ranks.rank), layout, ranks)
    return reduced, unpack(layout, reduced)


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


def checkpoint_state(callback: ModelCheckpoint, trainer: StandInTrainer, vote: bool = False) -> dict[str, Any]:
    """The visible state, as plain data; under a vote policy also this rank's own top-k scores (in save order)."""
    local = LocalTopK.of(callback) if vote else None
    return {
        "best_k_models": {path: float(score) for path, score in callback.best_k_models.items()},
        "kth_best_model_path": callback.kth_best_model_path,
        "best_model_path": callback.best_model_path,
        "best_model_score": None if callback.best_model_score is None else float(callback.best_model_score),
        "saved": list(trainer.saved),
        "removed": list(trainer.strategy.removed),
        "local_scores": None if local is None else [float(score) for score in local.scores.values()],
    }


def top_k_sequences(
    policies: list[Any], mode: str, save_top_k: int, values: list[float | None], accs: list[float | None]
) -> list[list[dict[str, Any]]]:
    """:func:`top_k_sequence` for each policy in turn, on the same values."""
    return [top_k_sequence(policy, mode, save_top_k, values, accs) for policy in policies]


def top_k_sequence(
    policy: Any, mode: str, save_top_k: int, values: list[float | None], accs: list[float | None]
) -> list[dict[str, Any]]:
    """Run ``save_topk_checkpoint`` once per epoch with this rank's values; the state after each epoch."""
    ranks = rank_group()
    strategy = StandInStrategy(ranks.world_size, ranks.rank, checkpoint_policy=policy)
    trainer = StandInTrainer(strategy)
    callback = make_checkpoint(mode, save_top_k)
    states = []
    for epoch, (value, acc) in enumerate(zip(values, accs)):
        trainer.global_step = 10 * epoch
        handled = decisions.save_topk_checkpoint(callback, trainer, candidates(epoch, value, acc))
        state = checkpoint_state(callback, trainer, vote=isinstance(strategy.checkpoint_policy, VotePolicy))
        state["handled"] = handled
        states.append(state)
    return states


def make_early_stopping(config: dict[str, Any]) -> EarlyStopping:
    callback = EarlyStopping(monitor="val_loss", **config)
    return callback


def early_stopping_state(callback: EarlyStopping) -> dict[str, Any]:
    return {
        "best_score": float(callback.best_score),
        "wait_count": callback.wait_count,
        "stopping_reason": callback.stopping_reason.name,
    }


def early_stop_rounds(
    policies: list[Any], config: dict[str, Any], starts: list[tuple[float, int]], value: float | None
) -> list[dict[str, Any]]:
    """:func:`early_stop_round` for each policy in turn (with its own starting state), on the same value."""
    return [early_stop_round(policy, config, *start, value) for policy, start in zip(policies, starts)]


def early_stop_round(
    policy: Any, config: dict[str, Any], best_score: float, wait_count: int, value: float | None
) -> dict[str, Any]:
    """One ``run_early_stopping_check`` with this rank's starting state and value."""
    ranks = rank_group()
    strategy = StandInStrategy(ranks.world_size, ranks.rank, early_stopping_policy=policy)
    trainer = StandInTrainer(strategy)
    trainer.current_epoch = 7
    callback = make_early_stopping(config)
    callback.best_score = torch.tensor(best_score)
    callback.wait_count = wait_count
    if value is not None:
        trainer.callback_metrics = {"val_loss": torch.tensor(value, dtype=torch.float32)}
    handled = decisions.run_early_stopping_check(callback, trainer)
    return {
        "handled": handled,
        "should_stop": trainer.should_stop,
        "stopped_epoch": callback.stopped_epoch,
        **early_stopping_state(callback),
    }


def is_nan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)
