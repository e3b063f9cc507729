"""Single-process references for the cross-rank decisions, built without lightning_ext.

A policy is named by a plain *spec* (``"all"``, ``"quorum:2"``, ``"two_thirds"``, ``"mean"``, ...); the ranks turn the
same spec into a lightning_ext policy (:func:`tests.helpers.decision_tasks.policy_from_spec`), while this module applies
its own rule table, written from the specification (``docs/policies.md``), not taken from ``lightning_ext.policies``.

The local parts are stock Lightning's own callback code run in one process: one stock ``ModelCheckpoint`` or
``EarlyStopping`` per simulated rank, fed that rank's values, its ``reduce_boolean_decision`` answering with the
rank's own decision. Those stock callbacks are also the top-k bookkeeping: each simulated rank's stock
``_update_best_and_save`` keeps what stock Lightning would keep on that rank, and rank 0's is the visible state.
Nothing here imports lightning_ext.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.callbacks import early_stopping

from tests.helpers import stand_ins

# docs/policies.md, "Vote policies": (yes votes, world size, rank 0's vote) -> act?
VOTE_RULES: dict[str, Callable[[int, int, bool], bool]] = {
    "all": lambda yes, world, rank_zero: yes == world,
    "any": lambda yes, world, rank_zero: yes >= 1,
    "majority": lambda yes, world, rank_zero: 2 * yes > world,  # strictly more than half: a tie does not act
    "rank_zero": lambda yes, world, rank_zero: rank_zero,
    "two_thirds": lambda yes, world, rank_zero: 3 * yes >= 2 * world,  # the README's own-policy example
}
AGGREGATES = ("mean", "min", "max")


class Expected(Exception):
    """The reference expects every rank to raise this message."""


def is_aggregate(spec: str) -> bool:
    return spec in AGGREGATES


def vote_rule(spec: str, votes: list[bool]) -> bool:
    """Whether a vote policy acts on these votes (``"quorum:k"``: at least ``k`` yes votes; ``"quorum%:p"``: at least
    ``p`` percent of the ranks, rounded up)."""
    yes, world = sum(votes), len(votes)
    if spec.startswith("quorum:"):
        return yes >= int(spec.split(":")[1])
    if spec.startswith("quorum%:"):
        return 100 * yes >= int(spec.split(":")[1]) * world
    return VOTE_RULES[spec](yes, world, votes[0])


def aggregate(kind: str, values: list[float]) -> float:
    """The agreed value: the unweighted mean over ranks, or the extreme; a NaN anywhere makes it NaN."""
    if kind == "mean":
        return sum(values) / len(values)
    if any(math.isnan(v) for v in values):
        return math.nan
    return min(values) if kind == "min" else max(values)


def as_float32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64).to(torch.float32)


class _LocalStrategy(stand_ins.StandInStrategy):
    """A single-process stand-in whose reduce_boolean_decision returns the rank's own decision."""

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision


def missing_message(present: list[bool]) -> str:
    missing = [rank for rank, has in enumerate(present) if not has]
    having = [rank for rank, has in enumerate(present) if has]
    return f"is missing on {_ranks(missing)} but logged on {_ranks(having)}"


def _ranks(ranks: list[int]) -> str:
    """How the messages name a few ranks (docs/architecture.md), written out here for worlds of at most 4: ``rank 0``,
    ``ranks 0 and 1``, ``ranks 0-2`` (three or more in a row), ``ranks 0, 2 and 3``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) >= 3 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def top_k_sequence(
    spec: str, mode: str, save_top_k: int, table: list[list[float | None]], accs: list[list[float | None]]
) -> list[list[dict[str, Any]]]:
    """The state each rank must show after each epoch, or raises ``Expected`` at the epoch where every rank errors.

    Each state is the visible state (rank 0's bookkeeping, on every rank) plus ``handled`` and, under a vote policy,
    ``local_scores``: the scores that stock Lightning would hold on that rank, in save order. Rank 0's states also
    carry ``record``: what its decision record must say of that epoch's decision (``None`` where none was made).
    """
    world, epochs = len(table), len(table[0])
    is_vote = not is_aggregate(spec)
    count = world if is_vote else 1
    sims = [stand_ins.make_checkpoint(mode, save_top_k) for _ in range(count)]
    trainers = [stand_ins.StandInTrainer(_LocalStrategy(world, rank)) for rank in range(count)]
    per_rank_states: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    for epoch in range(epochs):
        values = [table[rank][epoch] for rank in range(world)]
        present = [value is not None for value in values]
        record: dict[str, Any] | None = None
        saved_before = len(trainers[0].saved)
        for trainer in trainers:
            trainer.global_step = 10 * epoch
        rank_zero_decides = spec == "rank_zero" and present[0]  # a metric only rank 0 logs is enough there
        if any(present) and not all(present) and not rank_zero_decides:
            raise Expected(missing_message(present))
        if all(present) or rank_zero_decides:
            finite = [value is not None and math.isfinite(value) for value in values]
            if is_vote:
                # each rank votes as stock would on its own top-k; a non-finite value votes no; no value, no vote
                votes: list[bool | None] = [
                    None if value is None else bool(sim.check_monitor_top_k(trainer, stand_ins.tensor(value))) and ok
                    for sim, trainer, value, ok in zip(sims, trainers, values, finite)
                ]
                # the score recorded is rank 0's value: a non-finite one is never recorded, whatever the votes
                if vote_rule(spec, [bool(vote) for vote in votes]) and finite[0]:
                    for rank, (sim, trainer) in enumerate(zip(sims, trainers)):
                        own = values[rank] if values[rank] is not None else values[0]  # lacking it: rank 0's
                        found = stand_ins.candidates(epoch, own, accs[rank][epoch])
                        sim._update_best_and_save(found["val_loss"], trainer, found)
                record = {"votes": votes, "yes": sum(bool(vote) for vote in votes), "agreed": None}
            else:
                agreed = as_float32(aggregate(spec, values))  # type: ignore[arg-type]
                if math.isfinite(float(agreed)) and bool(sims[0].check_monitor_top_k(trainers[0], agreed)):
                    found = stand_ins.candidates(epoch, None, accs[0][epoch])
                    found["val_loss"] = agreed
                    sims[0]._update_best_and_save(agreed, trainers[0], found)
                record = {"votes": [None] * world, "yes": None, "agreed": float(agreed)}
            # every rank's own value, as the float32 tensor it logged
            record["values"] = [None if value is None else float(as_float32(value)) for value in values]
            record["outcome"] = "saved" if len(trainers[0].saved) > saved_before else "not saved"
        visible = stand_ins.checkpoint_state(sims[0], trainers[0])
        for rank in range(world):
            state = dict(visible, handled=all(present) or rank_zero_decides)
            state["local_scores"] = [float(s) for s in sims[rank].best_k_models.values()] if is_vote else None
            state["record"] = record if rank == 0 else None
            per_rank_states[rank].append(state)
    return per_rank_states


def early_stop_round(
    spec: str, config: dict[str, Any], starts: list[tuple[float, int]], values: list[float | None]
) -> list[dict[str, Any]]:
    """What each rank must report after one early-stopping check, or raises ``Expected``."""
    world = len(values)
    present = [value is not None for value in values]
    rank_zero_decides = spec == "rank_zero" and present[0]  # a metric only rank 0 logs is enough there
    if any(present) and not all(present) and not rank_zero_decides:
        raise Expected(missing_message(present))
    sims = []
    for best_score, wait_count in starts:
        sim = stand_ins.make_early_stopping(config)
        sim.best_score, sim.wait_count = torch.tensor(best_score), wait_count
        sims.append(sim)
    if not any(present):
        return [
            {
                "handled": False,
                "should_stop": False,
                "stopped_epoch": 0,
                **stand_ins.early_stopping_state(sim),
                "record": None,
            }
            for sim in sims
        ]
    nonfinite = config.get("check_finite", True) and any(v is not None and not math.isfinite(v) for v in values)
    record: dict[str, Any] = {"values": [None if value is None else float(as_float32(value)) for value in values]}
    if is_aggregate(spec):
        agreed = as_float32(aggregate(spec, values))  # type: ignore[arg-type]
        record.update(votes=[None] * world, yes=None, agreed=float(agreed))
        shared = sims[0]
        stop, _ = shared._evaluate_stopping_criteria(agreed)
        if nonfinite and not stop:
            if hasattr(early_stopping, "EarlyStoppingReason"):  # Lightning 2.6+ records why it stopped
                shared.stopping_reason = early_stopping.EarlyStoppingReason.NON_FINITE_METRIC
            stop = True
        sims = [copy.deepcopy(shared) for _ in range(world)]
    else:
        votes = [
            None if v is None else bool(sim._evaluate_stopping_criteria(stand_ins.tensor(v))[0])
            for sim, v in zip(sims, values)
        ]
        stop = vote_rule(spec, [bool(vote) for vote in votes]) or nonfinite
        record.update(votes=votes, yes=sum(bool(vote) for vote in votes), agreed=None)
    record["outcome"] = "stop" if stop else "go on"
    return [
        {
            "handled": True,
            "should_stop": stop,
            "stopped_epoch": 7 if stop else 0,
            **stand_ins.early_stopping_state(sim),
            "record": record if rank == 0 else None,
        }
        for rank, sim in enumerate(sims)
    ]
