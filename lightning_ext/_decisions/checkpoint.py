"""The cross-rank decision of ``ModelCheckpoint``: save a new top-k checkpoint on every rank, or on none."""

import functools
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lightning_ext._collective import RankGroup
from lightning_ext._decisions.agreement import agree, as_vote, decide, layout_kind, row_layout
from lightning_ext._decisions.local_top_k import LocalTopK
from lightning_ext._decisions.record import record, recording, top_k_before, topk_row
from lightning_ext._decisions.rows import Agreement, Observation
from lightning_ext.policies import DecisionPolicy, VotePolicy, VoteTally

__all__ = ["TopKDecision", "decide_top_k", "prepare_topk_decision", "save_topk_checkpoint"]

_TEMPLATE_KEY = re.compile(r"(\{.*?)[:\}]")  # the pattern ModelCheckpoint uses to find metrics in a file name
_TRAINER_KEYS = frozenset({"epoch", "step"})  # filled from the trainer, identical on every rank
_EARLY_DECISION = "_lightning_ext_early_decision"


@dataclass(frozen=True)
class TopKDecision:
    """The agreed outcome of one top-k decision (identical on every rank, but for ``local_score``).

    Attributes:
        save: whether every rank saves a new top-k checkpoint; never ``True`` when ``score`` is not finite.
        score: the value every rank records for it: the agreed value (aggregate) or rank 0's value (vote), whatever
            rank 0 voted.
        names: metric values to format file names with, identical on every rank (``None``: rank 0 lacks it).
        local_score: this rank's own value, for its own top-k (vote policies; ``None`` otherwise).
        agreement: what every rank received (for rank 0's decision record).
        wanted: what the vote policy said, before a non-finite score could veto it (``None``: aggregate policies).

    """

    save: bool
    score: Tensor
    names: dict[str, Tensor | None]
    agreement: Agreement
    local_score: Tensor | None = None
    wanted: bool | None = None


def save_topk_checkpoint(callback: ModelCheckpoint, trainer: Any, monitor_candidates: dict[str, Tensor]) -> bool:
    """``ModelCheckpoint._save_topk_checkpoint`` under ``trainer.strategy.checkpoint_policy``.

    Returns:
        ``True`` if it handled the call; ``False`` if the stock method must run instead (nothing to decide, or the
        metric is missing on every rank: then the stock error or warning is the same on every rank, and the stock
        path makes no collective).

    """
    if callback.save_top_k == 0 or callback.monitor is None:
        return False
    early = callback.__dict__.pop(_EARLY_DECISION, None)
    if early is not None and early[0] is monitor_candidates:
        decision = early[1]  # made by prepare_topk_decision for these very candidates: no second exchange
    else:
        policy: DecisionPolicy = trainer.strategy.checkpoint_policy
        ranks = RankGroup.from_strategy(trainer.strategy)
        decision = decide_top_k(ranks, policy, callback, trainer, monitor_candidates)
    if decision is None:
        return False
    before = top_k_before(callback) if recording(trainer) else None
    for key, value in decision.names.items():
        if value is None:
            monitor_candidates.pop(key, None)
        else:
            monitor_candidates[key] = value
    if decision.save:
        local_view = None if decision.local_score is None else LocalTopK.of(callback)  # before the state changes
        callback._update_best_and_save(decision.score, trainer, monitor_candidates)
        if local_view is not None and decision.local_score is not None:
            local_view.record(callback, decision.local_score)
    elif callback.verbose:
        epoch, step = monitor_candidates["epoch"], monitor_candidates["step"]
        if bool(torch.isfinite(decision.score)):
            outcome = f"was not in top {callback.save_top_k}"
        else:
            outcome = f"is {float(decision.score)} (not finite), so no top-{callback.save_top_k} checkpoint is saved"
        rank_zero_info(f"Epoch {epoch:d}, global step {step:d}: {callback.monitor!r} {outcome}")
    if before is not None:
        policy = trainer.strategy.checkpoint_policy
        agreement, wanted, saved, score = decision.agreement, decision.wanted, decision.save, float(decision.score)
        record(trainer, lambda: topk_row(callback, trainer, policy, agreement, wanted, saved, score, before))
    return True


def prepare_topk_decision(callback: ModelCheckpoint, trainer: Any, monitor_candidates: dict[str, Tensor]) -> None:
    """A step- or time-based save is due: decide it now, on every rank, before ``ModelCheckpoint`` looks for the metric.

    ``ModelCheckpoint.on_train_batch_end`` defers the save when the monitored metric is not logged yet, and it checks
    that on each rank alone: a metric logged on some ranks only would send those ranks into the decision's
    collective and the others not, a deadlock. Deciding here, where every rank arrives, turns that into
    ``MonitorMissingError`` on every rank. The decision is kept and used by :func:`save_topk_checkpoint` for the
    same candidates, so a step-based save still costs one exchange.
    """
    callback.__dict__.pop(_EARLY_DECISION, None)
    if callback.save_top_k == 0 or callback.monitor is None:
        return
    policy: DecisionPolicy = trainer.strategy.checkpoint_policy
    decision = decide_top_k(RankGroup.from_strategy(trainer.strategy), policy, callback, trainer, monitor_candidates)
    callback.__dict__[_EARLY_DECISION] = (monitor_candidates, decision)
    if decision is not None:  # rank_zero with a metric only rank 0 logs: ModelCheckpoint's own check must pass here too
        monitor_candidates.setdefault(callback.monitor, decision.score)


def decide_top_k(
    ranks: RankGroup,
    policy: DecisionPolicy,
    callback: ModelCheckpoint,
    trainer: Any,
    monitor_candidates: dict[str, Tensor],
) -> TopKDecision | None:
    """Agree whether to save a new top-k checkpoint; ``None`` if the metric is missing on every rank.

    Raises:
        MonitorMissingError: on every rank, if the metric is missing on some ranks only.
        LocalDecisionError: on every rank, if some rank could not make its local decision.

    """
    monitor = callback.monitor
    assert monitor is not None
    current = monitor_candidates.get(monitor)
    extra_keys = tuple(sorted(_template_keys(callback) - _TRAINER_KEYS - {monitor}))
    is_vote = isinstance(policy, VotePolicy)

    failure: BaseException | None = None
    value: float | None = None
    vote = False
    extras: tuple[float | None, ...] = ()
    kth: float | None = None  # this rank's own k-th best, and how many it keeps: what its vote was measured against
    kept = 0
    try:
        extras = tuple(float(monitor_candidates[k]) if k in monitor_candidates else None for k in extra_keys)
        if current is not None:
            value = float(current)
            if is_vote:
                own = LocalTopK.of(callback)
                kth, kept = (None if own.kth is None else float(own.scores[own.kth])), len(own.scores)
                with own.installed(callback), _local_decisions(trainer.strategy):
                    local = callback.check_monitor_top_k(trainer, current)
                vote = as_vote(local, f"{type(callback).__name__}.check_monitor_top_k") and math.isfinite(value)
    except Exception as exc:  # guards the user's side of a decision: their callback subclass's own methods and
        # their monitored values (any code, any error). Nothing narrower: whatever it raises is reported on every rank
        # after the exchange, so that no rank is left waiting in it
        failure, extras = exc, (None,) * len(extra_keys)

    layout = row_layout(layout_kind(policy), ranks.world_size, len(extra_keys))
    observation = Observation(value, vote, extras, failure is not None, kth, kept)
    agreement = agree(ranks, layout, observation, failure, callback, policy, "checkpoint_policy")
    if agreement.presence == "none":
        return None

    names: dict[str, Tensor | None] = {
        key: None if extra is None else torch.tensor(extra, dtype=torch.float64)
        for key, extra in zip(extra_keys, agreement.extras, strict=True)
    }
    if isinstance(policy, VotePolicy):
        wanted = decide(policy, VoteTally(agreement.yes, ranks.world_size, agreement.rank_zero_vote))
        # under rank_zero this rank may lack the metric: rank 0's value, as float32 (as a logged float is)
        dtype, device = (torch.float32, ranks.device) if current is None else (current.dtype, current.device)
        rank_zero = torch.tensor(agreement.value, dtype=dtype, device=device)
        names[monitor] = rank_zero
        # the score recorded is rank 0's value, whatever rank 0 voted: a non-finite one must never be recorded
        save = wanted and math.isfinite(agreement.value)
        local_score = rank_zero if current is None else current
        return TopKDecision(save, rank_zero, names, agreement, local_score=local_score, wanted=wanted)

    assert current is not None  # presence is "all" under an aggregate policy
    agreed = torch.tensor(agreement.value, dtype=current.dtype, device=current.device)
    with _local_decisions(trainer.strategy):
        local = callback.check_monitor_top_k(trainer, agreed)
    save = as_vote(local, f"{type(callback).__name__}.check_monitor_top_k") and bool(torch.isfinite(agreed))
    names[monitor] = agreed
    return TopKDecision(save, agreed, names, agreement)


@contextmanager
def _local_decisions(strategy: Any) -> Iterator[None]:
    """Within the block, ``strategy.reduce_boolean_decision`` returns this rank's own decision (no collective)."""
    previous = strategy.__dict__.get("reduce_boolean_decision")
    local: Callable[..., Any] = lambda decision, all=True: decision  # noqa: E731
    strategy.reduce_boolean_decision = local
    try:
        yield
    finally:
        if previous is None:
            del strategy.reduce_boolean_decision
        else:
            strategy.reduce_boolean_decision = previous


def _template_keys(callback: ModelCheckpoint) -> frozenset[str]:
    return _keys_in_templates(callback.filename or "{epoch}-{step}", callback.CHECKPOINT_NAME_LAST or "")


@functools.lru_cache(maxsize=256)
def _keys_in_templates(*templates: str) -> frozenset[str]:
    """The metric names in checkpoint file-name templates (cached: one parse per template, not per decision)."""
    return frozenset(group[1:] for template in templates for group in _TEMPLATE_KEY.findall(template))
