"""Single-process references for the cross-rank decisions.

The local parts are stock Lightning's own code run in one process: one stock ``ModelCheckpoint`` or ``EarlyStopping``
per simulated rank, fed that rank's values, its ``reduce_boolean_decision`` answering with a decision we set. The
policy rules are written here again, independently of ``lightning_ext.policies``.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason

from lightning_ext.policies import AggregatePolicy, AllRanks, AnyRank, Majority, Quorum, RankZero, resolve_policy
from tests import tasks


class Expected(Exception):
    """The reference expects every rank to raise this message."""


def vote_rule(policy: Any, votes: list[bool]) -> bool:
    policy = resolve_policy(policy)
    yes, world = sum(votes), len(votes)
    if isinstance(policy, AllRanks):
        return yes == world
    if isinstance(policy, AnyRank):
        return yes >= 1
    if isinstance(policy, Majority):
        return yes * 2 > world
    if isinstance(policy, RankZero):
        return votes[0]
    if isinstance(policy, Quorum):
        return yes >= policy.k
    if isinstance(policy, tasks.TwoThirds):
        return 3 * yes >= 2 * world
    raise AssertionError(f"no reference rule for {policy!r}")


def aggregate(kind: str, values: list[float]) -> float:
    if kind == "mean":
        return sum(values) / len(values)
    if any(math.isnan(v) for v in values):
        return math.nan
    return min(values) if kind == "min" else max(values)


def as_float32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64).to(torch.float32)


class _LocalStrategy(tasks.StandInStrategy):
    """A single-process stand-in whose reduce_boolean_decision returns the rank's own (or a preset) decision."""

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision


def missing_message(present: list[bool]) -> str:
    missing = [rank for rank, has in enumerate(present) if not has]
    having = [rank for rank, has in enumerate(present) if has]
    return f"is missing on rank(s) {missing} but logged on rank(s) {having}"


def top_k_sequence(
    policy: Any, mode: str, save_top_k: int, table: list[list[float | None]], accs: list[list[float | None]]
) -> list[list[dict[str, Any]]]:
    """The state each rank must show after each epoch, or raises ``Expected`` at the epoch where every rank errors."""
    world, epochs = len(table), len(table[0])
    policy = resolve_policy(policy)
    is_vote = not isinstance(policy, AggregatePolicy)
    count = world if is_vote else 1
    sims = [tasks.make_checkpoint(mode, save_top_k) for _ in range(count)]
    trainers = [tasks.StandInTrainer(_LocalStrategy(world, rank)) for rank in range(count)]
    per_rank_states: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    for epoch in range(epochs):
        values = [table[rank][epoch] for rank in range(world)]
        present = [value is not None for value in values]
        for trainer in trainers:
            trainer.global_step = 10 * epoch
        if any(present) and not all(present):
            raise Expected(missing_message(present))
        if all(present):
            if is_vote:
                votes = [
                    bool(sim.check_monitor_top_k(trainer, tasks.tensor(value))) and math.isfinite(value)
                    for sim, trainer, value in zip(sims, trainers, values)  # type: ignore[arg-type]
                ]
                if vote_rule(policy, votes):
                    for rank, (sim, trainer) in enumerate(zip(sims, trainers)):
                        found = tasks.candidates(epoch, values[rank], accs[rank][epoch])
                        sim._update_best_and_save(found["val_loss"], trainer, found)
            else:
                agreed = as_float32(aggregate(policy.reduction, values))  # type: ignore[attr-defined,arg-type]
                save = bool(sims[0].check_monitor_top_k(trainers[0], agreed)) and bool(torch.isfinite(agreed))
                if save:
                    found = tasks.candidates(epoch, None, accs[0][epoch])
                    found["val_loss"] = agreed
                    sims[0]._update_best_and_save(agreed, trainers[0], found)
        visible = tasks.checkpoint_state(sims[0], trainers[0])
        for rank in range(world):
            state = dict(visible, handled=all(present))
            if is_vote:
                state["local_scores"] = [float(score) for score in sims[rank].best_k_models.values()]
            else:
                state["local_scores"] = None
            per_rank_states[rank].append(state)
    return per_rank_states


def early_stop_round(
    policy: Any, config: dict[str, Any], starts: list[tuple[float, int]], values: list[float | None]
) -> list[dict[str, Any]]:
    """What each rank must report after one early-stopping check, or raises ``Expected``."""
    world = len(values)
    policy = resolve_policy(policy)
    present = [value is not None for value in values]
    if any(present) and not all(present):
        raise Expected(missing_message(present))
    sims = []
    for best_score, wait_count in starts:
        sim = tasks.make_early_stopping(config)
        sim.best_score, sim.wait_count = torch.tensor(best_score), wait_count
        sims.append(sim)
    if not any(present):
        return [
            {"handled": False, "should_stop": False, "stopped_epoch": 0, **tasks.early_stopping_state(sim)}
            for sim in sims
        ]
    nonfinite = config.get("check_finite", True) and any(not math.isfinite(v) for v in values)  # type: ignore[arg-type]
    if isinstance(policy, AggregatePolicy):
        agreed = as_float32(aggregate(policy.reduction, values))  # type: ignore[arg-type]
        shared = sims[0]
        stop, _ = shared._evaluate_stopping_criteria(agreed)
        if nonfinite and not stop:
            shared.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            stop = True
        sims = [copy.deepcopy(shared) for _ in range(world)]
    else:
        votes = [bool(sim._evaluate_stopping_criteria(tasks.tensor(v))[0]) for sim, v in zip(sims, values)]
        stop = vote_rule(policy, votes) or nonfinite
    return [
        {"handled": True, "should_stop": stop, "stopped_epoch": 7 if stop else 0, **tasks.early_stopping_state(sim)}
        for sim in sims
    ]
