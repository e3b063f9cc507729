"""The cross-rank decision of ``EarlyStopping``: stop every rank, or none."""

from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.callbacks import EarlyStopping, early_stopping
from torch import Tensor

from lightning_ext._collective import RankGroup
from lightning_ext._decisions.agreement import agree, as_vote, decide, layout_kind, row_layout
from lightning_ext._decisions.record import record, stop_row
from lightning_ext._decisions.rows import Agreement, Observation
from lightning_ext.policies import DecisionPolicy, VotePolicy, VoteTally

__all__ = [
    "StopDecision",
    "decide_early_stop",
    "record_nonfinite_stop",
    "record_stop_message",
    "run_early_stopping_check",
]


@dataclass(frozen=True)
class StopDecision:
    """The agreed outcome of one early-stopping check.

    Attributes:
        stop: whether every rank stops.
        reason: the message explaining this rank's outcome, if any.
        agreement: what every rank received (for rank 0's decision record).
        wanted: what the policy (or the stock rule on the agreed value) said, before a non-finite value overrode it.
        best_before: this rank's ``best_score`` before the check.
        agreed: the agreed value, in the metric's dtype (aggregate policies).

    """

    stop: bool
    reason: str | None
    agreement: Agreement
    wanted: bool
    best_before: float | None
    agreed: float | None = None


def run_early_stopping_check(callback: EarlyStopping, trainer: Any) -> bool:
    """``EarlyStopping._run_early_stopping_check`` under ``trainer.strategy.early_stopping_policy``.

    Returns:
        ``True`` if it handled the call; ``False`` if the stock method must run instead (``fast_dev_run``, or the
        metric is missing on every rank: the stock error or warning, with no collective).

    """
    if trainer.fast_dev_run:
        return False
    logs = trainer.callback_metrics
    policy: DecisionPolicy = trainer.strategy.early_stopping_policy
    decision = decide_early_stop(RankGroup.from_strategy(trainer.strategy), policy, callback, logs)
    if decision is None:
        return False
    trainer.should_stop = trainer.should_stop or decision.stop
    if decision.stop:
        callback.stopped_epoch = trainer.current_epoch
        record_stop_message(callback, decision.reason)
    if decision.reason and callback.verbose:
        callback._log_info(trainer, decision.reason, callback.log_rank_zero_only)
    agreement, wanted, best, agreed = decision.agreement, decision.wanted, decision.best_before, decision.agreed
    record(trainer, lambda: stop_row(callback, trainer, policy, agreement, decision.stop, wanted, best, agreed))
    return True


def decide_early_stop(
    ranks: RankGroup, policy: DecisionPolicy, callback: EarlyStopping, logs: dict[str, Tensor]
) -> StopDecision | None:
    """Agree whether to stop; updates the callback's own state; ``None`` if the metric is missing on every rank.

    Raises:
        MonitorMissingError: on every rank, if the metric is missing on some ranks only.
        LocalDecisionError: on every rank, if some rank could not make its local decision.

    """
    current = logs.get(callback.monitor)
    failure: BaseException | None = None
    value: float | None = None
    vote = False
    reason: str | None = None
    best_before = None if callback.best_score is None else float(callback.best_score)
    try:
        if current is not None:
            current = current.squeeze()
            value = float(current)
            if isinstance(policy, VotePolicy):
                should_stop, reason = callback._evaluate_stopping_criteria(current)
                vote = as_vote(should_stop, f"{type(callback).__name__}._evaluate_stopping_criteria")
    except Exception as exc:  # guards the user's side of a decision: their callback subclass's own methods and
        # their monitored value (any code, any error). Nothing narrower: whatever it raises is reported on every rank
        # after the exchange, so that no rank is left waiting in it
        failure = exc

    layout = row_layout(layout_kind(policy), ranks.world_size, 0)
    # its best before and its wait count after: what its vote was measured against
    observation = Observation(value, vote, (), failure is not None, best_before, int(callback.wait_count))
    agreement = agree(ranks, layout, observation, failure, callback, policy, "early_stopping_policy")
    if agreement.presence == "none":
        return None
    nonfinite_stop = callback.check_finite and agreement.nonfinite
    nonfinite_reason = (
        f"Monitored metric {callback.monitor} is not finite on at least one rank. Signaling every rank to stop."
    )

    if isinstance(policy, VotePolicy):
        tally = VoteTally(agreement.yes, ranks.world_size, agreement.rank_zero_vote)
        stop = wanted = decide(policy, tally)
        if stop and not vote:
            reason = f"{tally.yes} of {tally.world_size} rank(s) asked to stop; policy {policy!r} stops every rank."
        if nonfinite_stop and not stop:  # overrides any policy, on every rank alike
            stop = True
            reason = reason if vote else nonfinite_reason  # the non-finite rank keeps its own stock message
        return StopDecision(stop, reason, agreement, wanted, best_before)

    assert current is not None  # presence is "all" under an aggregate policy
    agreed = torch.tensor(agreement.value, dtype=current.dtype, device=current.device)
    should_stop, reason = callback._evaluate_stopping_criteria(agreed)
    stop = wanted = as_vote(should_stop, f"{type(callback).__name__}._evaluate_stopping_criteria")
    if nonfinite_stop and not stop:
        record_nonfinite_stop(callback)
        stop, reason = True, nonfinite_reason
    return StopDecision(stop, reason, agreement, wanted, best_before, float(agreed))


def record_stop_message(callback: Any, message: str | None) -> None:
    """Record why ``callback`` stopped the run, where Lightning records it (``stopping_reason_message``, 2.6+)."""
    if hasattr(callback, "stopping_reason_message"):
        callback.stopping_reason_message = message


def record_nonfinite_stop(callback: Any) -> None:
    """Record a non-finite metric as the reason ``callback`` stopped, where Lightning records reasons (2.6+)."""
    reasons = getattr(early_stopping, "EarlyStoppingReason", None)  # new in Lightning 2.6
    if reasons is not None:
        callback.stopping_reason = reasons.NON_FINITE_METRIC
