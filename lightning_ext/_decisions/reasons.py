"""The one sentence that says why a decision came out as it did, for rank 0's decision record; pure."""

import math
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lightning_ext._decisions.agreement import policy_label
from lightning_ext._decisions.rows import RankView
from lightning_ext._rank_lists import ranks_text
from lightning_ext.policies import AggregatePolicy, AllRanks, AnyRank, DecisionPolicy, Majority, Quorum, RankZero

__all__ = ["StopState", "TopKState", "stop_reason", "topk_reason"]

_NAMED = 3  # ranks named, with their reasons, per clause
_NO_VOTE = RankView(None, None, False, None, 0)  # a rank whose vote does not count (rank_zero)


@dataclass(frozen=True)
class TopKState:
    """A ``ModelCheckpoint``'s settings, and its visible top-k before the decision (for aggregate policies)."""

    save_top_k: int
    mode: str
    kept: int = 0
    kth: float | None = None
    stock_rule: bool = True


@dataclass(frozen=True)
class StopState:
    """An ``EarlyStopping``'s settings, and (aggregate policies) its shared best and wait count."""

    mode: str
    patience: int
    min_delta: float = 0.0
    stopping_threshold: float | None = None
    divergence_threshold: float | None = None
    check_finite: bool = True
    stock_rule: bool = True
    best: float | None = None
    wait: int = 0


def topk_reason(
    policy: DecisionPolicy,
    ranks: Sequence[RankView],
    state: TopKState,
    *,
    saved_as: str | None,
    score: float,
    agreed: float | None = None,
    wanted: bool | None = None,
) -> str:
    """Why a top-k checkpoint was (not) saved: the side of the vote that matches the verdict, rank by rank, then the
    policy's rule; or the aggregate against the top-k. Numbers show six significant digits, or every digit where
    two compared numbers would print alike; at most three ranks are named per clause. A callback that overrides the
    stock rule gets a neutral phrase, never a guessed reason.

    Example:
        >>> views = [RankView(0.9, True, False, 0.95, 1), RankView(0.93, False, False, 0.91, 1)]
        >>> topk_reason(AllRanks(), views, TopKState(save_top_k=1, mode="min"), saved_as=None, score=0.9)
        "not saved: rank 1 voted no (0.93 is not better than its best 0.91); 'all' needs every rank"

    """
    saved = saved_as is not None
    head = f"saved as {os.path.basename(saved_as)}" if saved_as is not None else "not saved"
    if isinstance(policy, AggregatePolicy):
        what = _agreed(policy, ranks, agreed)
        if not math.isfinite(score):
            return f"{head}: {what}, is not finite, and a non-finite score never wins a checkpoint"
        return f"{head}: {what}, {_against_top_k(score, saved, state, None, 'the')[1]}"
    wanted = saved if wanted is None else wanted
    voters = ranks if not isinstance(policy, RankZero) else [ranks[0], *(_NO_VOTE for _ in ranks[1:])]
    counted = not isinstance(policy, (AllRanks, AnyRank, RankZero))
    votes = _votes(voters, wanted, ("voted yes", "voted no"), lambda view: _topk_phrase(view, state), counted)
    if wanted and not saved:
        return (
            f"not saved: {votes}, enough for {_quoted(policy)}, but rank 0's value {_fmt(score)} would be the recorded"
            " score, and a non-finite score never wins a checkpoint"
        )
    return f"{head}: {votes}; {_rule(policy, len(ranks), saved, checkpoint=True)}"


def stop_reason(
    policy: DecisionPolicy,
    ranks: Sequence[RankView],
    state: StopState,
    *,
    stop: bool,
    wanted: bool,
    agreed: float | None = None,
) -> str:
    """Why training stopped, or goes on."""
    head = "stop" if stop else "go on"
    nonfinite = [rank for rank, view in enumerate(ranks) if view.value is not None and not math.isfinite(view.value)]
    if stop and not wanted and state.check_finite and nonfinite:
        listed = " and ".join(f"{_fmt(ranks[rank].value)} on rank {rank}" for rank in nonfinite[:_NAMED])
        return f"stop: a non-finite value ({listed}), and check_finite=True stops every rank whatever the policy"
    if isinstance(policy, AggregatePolicy):
        what = _agreed(policy, ranks, agreed)
        _, phrase = _stop_phrase(agreed, state.best, state.wait, stop, state, "the")
        return f"{head}: {what}, {phrase or ('asked to stop' if stop else 'did not ask to stop')}"
    voters = ranks if not isinstance(policy, RankZero) else [ranks[0], *(_NO_VOTE for _ in ranks[1:])]
    counted = not isinstance(policy, (AllRanks, AnyRank, RankZero))
    votes = _votes(
        voters,
        wanted,
        ("asked to stop", "did not ask to stop"),
        lambda view: _joined(_stop_phrase(view.value, view.reference, view.detail, bool(view.vote), state, "its")),
        counted,
    )
    return f"{head}: {votes}; {_rule(policy, len(ranks), stop, checkpoint=False)}"


def _votes(
    ranks: Sequence[RankView], wanted: bool, words: tuple[str, str], explain: Callable[[RankView], str], others: bool
) -> str:
    """``rank 2 voted no (...)``: the side that matches the verdict, with each rank's reason; with ``others``, the
    other side by number."""
    voters = [rank for rank, view in enumerate(ranks) if view.vote is not None]
    sides = ([r for r in voters if ranks[r].vote], [r for r in voters if not ranks[r].vote])
    deciding, other = sides if wanted else sides[::-1]
    word, other_word = words if wanted else words[::-1]
    if not deciding:
        clause = f"no rank {word}"
        deciding = other  # everyone is on the other side: say why
    elif not other and len(voters) == len(ranks) > 1:
        clause = f"every rank {word}" if wanted or word == "voted no" else f"no rank {words[0]}"
    else:
        clause = f"{ranks_text(deciding, _NAMED)} {word}"
    reasons = {rank: explain(ranks[rank]) for rank in deciding}
    if len(set(reasons.values())) == 1 and next(iter(reasons.values())):
        clause += f" ({next(iter(reasons.values()))})"
    else:
        shown = [f"rank {rank}: {text}" for rank, text in list(reasons.items())[:_NAMED] if text]
        clause += f" ({'; '.join(shown)})" if shown else ""
    if others and other and deciding is not other:
        clause += f", {ranks_text(other, _NAMED)} {other_word}"
    return clause


def _rule(policy: DecisionPolicy, world: int, acted: bool, *, checkpoint: bool) -> str:
    label = _quoted(policy)
    if isinstance(policy, AllRanks):
        return f"{label} needs every rank" if checkpoint else f"{label} stops only when every rank asks"
    if isinstance(policy, AnyRank):
        return f"{label} needs one rank" if checkpoint else f"{label} stops when one rank asks"
    if isinstance(policy, RankZero):
        return f"{label} follows rank 0"
    if isinstance(policy, Majority):
        need, extra = world // 2 + 1, ""
    elif isinstance(policy, Quorum):
        need = policy.needed(world)
        extra = "" if isinstance(policy.k, int) else f" ({policy.k * 100:g}%, rounded up)"
    else:
        verdict = ("to save" if acted else "not to save") if checkpoint else ("to stop" if acted else "not to stop")
        return f"{label} decided {verdict}"
    return (
        f"{label} needs {need} of {world}{extra}" if checkpoint else f"{label} stops when {need} of {world} ask{extra}"
    )


def _quoted(policy: DecisionPolicy) -> str:
    label = policy_label(policy)
    return f"'{label}'" if label.isidentifier() else label


def _agreed(policy: AggregatePolicy, ranks: Sequence[RankView], agreed: float | None) -> str:
    values = [view.value for view in ranks]
    if len(ranks) == 1:
        return f"the value, {_fmt(agreed)}"
    if policy.reduction == "mean":
        return f"the mean of {len(ranks)} ranks' values, {_fmt(agreed)}"
    word = "smallest" if policy.reduction == "min" else "largest"
    at = next((rank for rank, v in enumerate(values) if v == agreed or (v is not None and math.isnan(v))), None)
    return f"the {word} value, {_fmt(agreed)}" + ("" if at is None else f" (rank {at})")


def _topk_phrase(view: RankView, state: TopKState) -> str:
    if view.value is None:
        return ""
    if not state.stock_rule:
        return f"its own rule said {'yes' if view.vote else 'no'} to {_fmt(view.value)}"
    if not math.isfinite(view.value):
        return f"{_fmt(view.value)} is not finite"
    return _joined(_against_top_k(view.value, bool(view.vote), state, view, "its"))


def _joined(phrase: tuple[str, str]) -> str:
    """``0.93 is not better than ...`` from its subject and predicate (nothing when there is no predicate)."""
    subject, predicate = phrase
    if not predicate:
        return ""
    return f"{subject} {predicate}" if subject else predicate


def _against_top_k(value: float, better: bool, state: TopKState, view: RankView | None, whose: str) -> tuple[str, str]:
    """``("0.93", "is not better than its best 0.91")``, ``("", "its top 3 is not full (1 saved)")``, ..."""
    k = state.save_top_k
    kept, kth = (view.detail, view.reference) if view is not None else (state.kept, state.kth)
    if k == -1:
        return "", "save_top_k=-1 keeps every checkpoint"
    if kept < k:
        return "", f"{whose} first score" if kept == 0 else f"{whose} top {k} is not full ({kept} saved)"
    if kth is None:
        return "", ""
    shown, threshold = _pair(value, kth)
    target = f"{whose} best {threshold}" if k == 1 else f"the worst of {whose} top {k}, {threshold}"
    return shown, f"is {'' if better else 'not '}better than {target}"


def _stop_phrase(
    value: float | None, best: float | None, wait: int, stop: bool, state: StopState, whose: str
) -> tuple[str, str]:
    """``("0.93", "did not improve on its best 0.91 in 3 checks, patience 3")``; no predicate where the callback's
    verdict is not the stock rule's (a subclass, or a rounding edge): better nothing than a guess."""
    if value is None:
        return "", ""
    if not state.stock_rule:
        return "", f"its own rule said {'stop' if stop else 'go on'} at {_fmt(value)}"
    better: Callable[[float, float], bool] = operator.lt if state.mode == "min" else operator.gt
    shown = _fmt(value)
    if state.check_finite and not math.isfinite(value):
        predicate, stops = "is not finite", True
    elif state.stopping_threshold is not None and better(value, state.stopping_threshold):
        predicate, stops = f"reached the stopping threshold {_fmt(state.stopping_threshold)}", True
    elif state.divergence_threshold is not None and better(-value, -state.divergence_threshold):
        predicate, stops = f"passed the divergence threshold {_fmt(state.divergence_threshold)}", True
    elif best is None:
        return "", ""
    elif better(value - state.min_delta, best):
        shown, known = _pair(value, best)
        predicate, stops = f"improved on {whose} best {known}", False
    else:
        shown, known = _pair(value, best)
        margin = f" by more than {_fmt(abs(state.min_delta))}" if state.min_delta else ""
        stops = wait >= state.patience
        predicate = f"did not improve on {whose} best {known}{margin}"
        checks = f"{wait} check" + ("" if wait == 1 else "s")
        predicate += f" in {checks}, patience {state.patience}" if stops else f", {wait} of patience {state.patience}"
    return (shown, predicate) if stops == stop else ("", "")


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    short = repr(value)
    return short if len(short) <= 10 else f"{value:.6g}"


def _pair(a: float, b: float) -> tuple[str, str]:
    """Both numbers, with every digit where six would print two different numbers alike."""
    shown = _fmt(a), _fmt(b)
    return (repr(a), repr(b)) if shown[0] == shown[1] and a != b else shown
