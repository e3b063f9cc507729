"""One decision's exchange (one all-to-all of every rank's row), and the errors every rank raises together."""

import functools
from typing import Any, NoReturn

from torch import Tensor

from lightning_ext._collective import RankGroup, all_gather_objects, gather_rows
from lightning_ext._decisions.rows import Agreement, Observation, RowLayout, agree_rows, pack
from lightning_ext._rank_lists import ranks_text
from lightning_ext.errors import LocalDecisionError, MonitorMissingError, mark_joint
from lightning_ext.policies import (
    AggregatePolicy,
    AllRanks,
    AnyRank,
    DecisionPolicy,
    Majority,
    Quorum,
    RankZero,
    VotePolicy,
    VoteTally,
)

__all__ = ["agree", "as_vote", "decide", "layout_kind", "policy_label", "row_layout"]


@functools.lru_cache(maxsize=256)
def row_layout(kind: Any, world_size: int, extras: int) -> RowLayout:
    """A decision's row layout (cached: a run uses a handful, and each is validated once)."""
    return RowLayout(kind, world_size, extras=extras)


def layout_kind(policy: DecisionPolicy) -> Any:
    """The row layout's kind for ``policy``: its reduction (aggregate policies) or ``"vote"``."""
    if isinstance(policy, AggregatePolicy):
        return policy.reduction
    if isinstance(policy, VotePolicy):
        return "vote"
    raise TypeError(f"{policy!r} is neither a VotePolicy nor an AggregatePolicy")


def agree(
    ranks: RankGroup,
    layout: RowLayout,
    observation: Observation,
    failure: BaseException | None,
    callback: Any,
    policy: DecisionPolicy,
    option: str,
) -> Agreement:
    """The one exchange of a decision, and the errors every rank raises together.

    A metric that only some ranks have is an error (``MonitorMissingError``), but under ``rank_zero`` when rank 0 has
    it: rank 0's value decides there, and a metric logged on rank 0 only (``rank_zero_only=True``) is all it needs.
    """
    agreement = agree_rows(layout, gather_rows(pack(layout, observation, rank=ranks.rank), ranks))
    if agreement.failed:
        _raise_failure(ranks, failure, callback)
    rank_zero_decides = isinstance(policy, RankZero) and agreement.ranks[0].value is not None
    if agreement.presence == "mixed" and not rank_zero_decides:
        _raise_missing(agreement, callback, policy, option)
    return agreement


def _raise_failure(ranks: RankGroup, failure: BaseException | None, callback: Any) -> NoReturn:
    local = None if failure is None else f"{type(failure).__name__}: {failure}"
    reports = all_gather_objects(local, ranks)
    details = "; ".join(f"rank {rank}: {report}" for rank, report in enumerate(reports) if report is not None)
    message = f"{_describe(callback)} could not make its cross-rank decision. {details}"
    raise mark_joint(LocalDecisionError(message)) from failure


def _raise_missing(agreement: Agreement, callback: Any, policy: DecisionPolicy, option: str) -> NoReturn:
    missing = [rank for rank, view in enumerate(agreement.ranks) if view.value is None]
    having = [rank for rank, view in enumerate(agreement.ranks) if view.value is not None]
    message = (
        f"{_describe(callback)}: the monitored metric {callback.monitor!r} is missing on {ranks_text(missing, None)}"
        f" but logged on {ranks_text(having, None)} (world size {len(agreement.ranks)})."
    )
    if 0 in having:  # as `self.log(..., rank_zero_only=True)` under `if self.trainer.is_global_zero:` leaves it
        message += (
            f" Under {option}={policy_label(policy)!r} every rank decides with its own value, so every rank must log"
            f" it. For a metric that only rank 0 logs (`rank_zero_only=True`), use {option}='rank_zero': rank 0's"
            " value then decides for every rank. Or log it on every rank."
        )
    else:
        message += (
            " Every rank must log it at the same point: do not log it only under `if self.trainer.is_global_zero:` or"
            " with `rank_zero_only=True`."
        )
    raise mark_joint(MonitorMissingError(message))


def policy_label(policy: DecisionPolicy) -> str:
    """How users name ``policy``: ``all``, ``majority``, ``mean``, ``Quorum(0.75)``, ... or its ``repr``.

    Example:
        >>> policy_label(Majority()), policy_label(Quorum(0.75)), policy_label(AggregatePolicy("min"))
        ('majority', 'Quorum(0.75)', 'min')

    """
    if isinstance(policy, Quorum):
        return f"Quorum({policy.k!r})"
    if isinstance(policy, AggregatePolicy):
        return policy.reduction
    names: dict[type[DecisionPolicy], str] = {
        AllRanks: "all",
        AnyRank: "any",
        Majority: "majority",
        RankZero: "rank_zero",
    }
    return names.get(type(policy), repr(policy))


def _describe(callback: Any) -> str:
    return f"{type(callback).__name__}(monitor={callback.monitor!r})"


def decide(policy: VotePolicy, tally: VoteTally) -> bool:
    """``policy.decide(tally)``, which must be a bool (every rank runs it on the same tally, so every rank raises)."""
    decision = policy.decide(tally)
    if not isinstance(decision, bool):
        raise mark_joint(  # every rank runs the policy on the same tally
            TypeError(
                f"{policy!r}.decide({tally}) returned {decision!r} of type {type(decision).__name__}; a decision"
                " policy must return a bool"
            )
        )
    return decision


def as_vote(decision: Any, source: str) -> bool:
    """A rank's own decision as a bool (a one-element tensor counts); ``TypeError`` naming ``source`` otherwise."""
    if isinstance(decision, bool):
        return decision
    if isinstance(decision, Tensor) and decision.numel() == 1:
        return bool(decision)
    raise TypeError(f"{source} returned {decision!r} of type {type(decision).__name__}; a decision must be a bool")
