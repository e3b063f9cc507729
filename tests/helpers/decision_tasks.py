"""Functions that run inside the rank processes of a :class:`tests.helpers.pool.RankPool` (real gloo collectives).

Each takes plain, picklable arguments and returns plain results, so the parent can compare every rank's answer with a
single-process reference. The trainer stand-in below replaces only what a callback reads from a ``Trainer``; every
cross-rank exchange goes through ``torch.distributed`` for real.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_ext._collective import RankGroup, gather_rows
from lightning_ext._decisions import checkpoint, early_stopping
from lightning_ext._decisions.local_top_k import LocalTopK
from lightning_ext._decisions.rows import Observation, RowLayout, agree_rows, pack
from lightning_ext.policies import DecisionPolicy, Quorum, VotePolicy, VoteTally, resolve_policy
from tests.helpers import stand_ins as _stand_ins
from tests.helpers.stand_ins import (
    StandInStrategy,
    StandInTrainer,
    candidates,
    early_stopping_state,
    make_checkpoint,
    make_early_stopping,
)


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


class RecordSink:
    """Rank 0's decision record, kept in memory: each row as the record builds it (an error in building is raised)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def record(self, build: Any) -> None:
        self.rows.append(build())


def recorded(sink: RecordSink | None, before: int) -> dict[str, Any] | None:
    """What the test compares of the row recorded since ``before`` (``None``: none was recorded, or not rank 0)."""
    if sink is None or len(sink.rows) == before:
        return None
    assert len(sink.rows) == before + 1, sink.rows[before:]
    row = sink.rows[-1]
    assert isinstance(row["reason"], str) and row["reason"].startswith(("saved", "not saved", "stop", "go on"))
    return {key: list(row[key]) if key in ("values", "votes") else row[key] for key in RECORDED}


RECORDED = ("values", "votes", "yes", "agreed", "outcome")


def policy_from_spec(spec: str) -> DecisionPolicy:
    """The lightning_ext policy that a reference spec names (``"quorum:2"`` → ``Quorum(2)``, ...)."""
    if spec.startswith("quorum:"):
        return Quorum(int(spec.split(":")[1]))
    if spec.startswith("quorum%:"):
        return Quorum(int(spec.split(":")[1]) / 100)
    if spec == "two_thirds":
        return TwoThirds()
    return resolve_policy(spec)


def rank_group() -> RankGroup:
    if dist.is_available() and dist.is_initialized():
        return RankGroup(dist.get_world_size(), dist.get_rank(), torch.device("cpu"))
    return RankGroup(1, 0, torch.device("cpu"))


def exchange(kind: str, n_extras: int, observation: Observation) -> tuple[list[list[int]], Any]:
    """One decision's exchange; returns every rank's row as received (to compare across ranks) and the agreement."""
    ranks = rank_group()
    layout = RowLayout(kind, ranks.world_size, extras=n_extras)  # type: ignore[arg-type]
    rows = gather_rows(pack(layout, observation, rank=ranks.rank), ranks)
    return rows, agree_rows(layout, rows)


def checkpoint_state(callback: ModelCheckpoint, trainer: StandInTrainer, vote: bool) -> dict[str, Any]:
    """The visible state, as plain data; under a vote policy also this rank's own top-k scores (in save order)."""
    local = LocalTopK.of(callback) if vote else None
    state = _stand_ins.checkpoint_state(callback, trainer)
    state["local_scores"] = None if local is None else [float(score) for score in local.scores.values()]
    return state


def top_k_sequences(
    specs: list[str], mode: str, save_top_k: int, values: list[float | None], accs: list[float | None]
) -> list[list[dict[str, Any]]]:
    """:func:`top_k_sequence` for each policy spec in turn, on the same values."""
    return [top_k_sequence(spec, mode, save_top_k, values, accs) for spec in specs]


def top_k_sequence(
    spec: str, mode: str, save_top_k: int, values: list[float | None], accs: list[float | None]
) -> list[dict[str, Any]]:
    """Run ``save_topk_checkpoint`` once per epoch with this rank's values; the state after each epoch."""
    ranks = rank_group()
    strategy = StandInStrategy(ranks.world_size, ranks.rank, checkpoint_policy=policy_from_spec(spec))
    sink = strategy.decision_file = RecordSink() if ranks.rank == 0 else None
    trainer = StandInTrainer(strategy)
    callback = make_checkpoint(mode, save_top_k)
    states = []
    for epoch, (value, acc) in enumerate(zip(values, accs)):
        trainer.global_step = 10 * epoch
        before = 0 if sink is None else len(sink.rows)
        handled = checkpoint.save_topk_checkpoint(callback, trainer, candidates(epoch, value, acc))
        state = checkpoint_state(callback, trainer, vote=isinstance(strategy.checkpoint_policy, VotePolicy))
        state["handled"] = handled
        state["record"] = recorded(sink, before)
        states.append(state)
    return states


def early_stop_rounds(
    specs: list[str], config: dict[str, Any], starts: list[tuple[float, int]], value: float | None
) -> list[dict[str, Any]]:
    """:func:`early_stop_round` for each policy spec in turn (with its own starting state), on the same value."""
    return [early_stop_round(spec, config, *start, value) for spec, start in zip(specs, starts)]


def early_stop_round(
    spec: str, config: dict[str, Any], best_score: float, wait_count: int, value: float | None
) -> dict[str, Any]:
    """One ``run_early_stopping_check`` with this rank's starting state and value."""
    ranks = rank_group()
    strategy = StandInStrategy(ranks.world_size, ranks.rank, early_stopping_policy=policy_from_spec(spec))
    sink = strategy.decision_file = RecordSink() if ranks.rank == 0 else None
    trainer = StandInTrainer(strategy)
    trainer.current_epoch = 7
    callback = make_early_stopping(config)
    callback.best_score = torch.tensor(best_score)
    callback.wait_count = wait_count
    if value is not None:
        trainer.callback_metrics = {"val_loss": torch.tensor(value, dtype=torch.float32)}
    handled = early_stopping.run_early_stopping_check(callback, trainer)
    return {
        "handled": handled,
        "should_stop": trainer.should_stop,
        "stopped_epoch": callback.stopped_epoch,
        **early_stopping_state(callback),
        "record": recorded(sink, 0),
    }
