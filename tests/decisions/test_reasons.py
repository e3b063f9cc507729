"""The decision record's reason sentences, in one process: one worked case per policy and outcome."""

import math

import pytest

from lightning_ext._decisions.reasons import StopState, TopKState, stop_reason, topk_reason
from lightning_ext._decisions.rows import RankView
from lightning_ext.policies import AggregatePolicy, AllRanks, AnyRank, Majority, Quorum, RankZero, VotePolicy, VoteTally

NAN, INF = math.nan, math.inf
TOP1 = TopKState(save_top_k=1, mode="min")
PATIENCE_3 = StopState(mode="min", patience=3)


def vote(value: float | None, yes: bool | None, best: float | None = None, kept: int = 1) -> RankView:
    """A rank's part of a vote: its value, its vote, its own k-th best and how many it keeps (or, for early stopping,
    its best before and its wait count after)."""
    return RankView(value, yes, False, best, kept)


def value(v: float) -> RankView:
    return RankView(v, None, False, None, 0)


class TwoThirds(VotePolicy):
    def decide(self, tally: VoteTally) -> bool:
        return 3 * tally.yes >= 2 * tally.world_size

    def __repr__(self) -> str:
        return "TwoThirds()"


@pytest.mark.parametrize(
    ("policy", "ranks", "saved_as", "score", "wanted", "expected"),
    [
        (  # the issue's own example
            AllRanks(),
            [vote(0.9, True, 0.95), vote(0.88, True, 0.95), vote(0.93, False, 0.91)],
            None,
            0.9,
            False,
            "not saved: rank 2 voted no (0.93 is not better than its best 0.91); 'all' needs every rank",
        ),
        (
            AllRanks(),
            [vote(4.0, True, None, 0)] * 3,
            "/c/epoch=0-val_loss=4.00.ckpt",
            4.0,
            True,
            "saved as epoch=0-val_loss=4.00.ckpt: every rank voted yes (its first score); 'all' needs every rank",
        ),
        (  # docs/policies.md, worked example 2: rank 0's worse value is recorded
            AnyRank(),
            [vote(5.0, False, 4.0), vote(3.0, True, 4.0)],
            "/c/epoch=1-val_loss=5.00.ckpt",
            5.0,
            True,
            "saved as epoch=1-val_loss=5.00.ckpt: rank 1 voted yes (3.0 is better than its best 4.0); 'any' needs one"
            " rank",
        ),
        (
            AnyRank(),
            [vote(5.0, False, 4.0), vote(4.5, False, 4.0)],
            None,
            5.0,
            False,
            "not saved: every rank voted no (rank 0: 5.0 is not better than its best 4.0; rank 1: 4.5 is not better"
            " than its best 4.0); 'any' needs one rank",
        ),
        (  # worked example 1, epoch 2
            Majority(),
            [vote(3.5, True, 4.0), vote(3.5, True, 4.0), vote(4.5, False, 4.0)],
            "/c/epoch=2-val_loss=3.50.ckpt",
            3.5,
            True,
            "saved as epoch=2-val_loss=3.50.ckpt: ranks 0 and 1 voted yes (3.5 is better than its best 4.0), rank 2"
            " voted no; 'majority' needs 2 of 3",
        ),
        (
            Quorum(0.75),
            [vote(0.8, True, 0.85), vote(0.9, False, 0.85), vote(0.9, False, 0.85), vote(0.8, True, 0.85)],
            None,
            0.8,
            False,
            "not saved: ranks 1 and 2 voted no (0.9 is not better than its best 0.85), ranks 0 and 3"
            " voted yes; Quorum(0.75) needs 3 of 4 (75%, rounded up)",
        ),
        (  # worked example 3: NaN on rank 0 blocks a save the votes wanted
            AnyRank(),
            [vote(NAN, False, 4.0), vote(2.0, True, 4.0), vote(2.0, True, 4.0)],
            None,
            NAN,
            True,
            "not saved: ranks 1 and 2 voted yes (2.0 is better than its best 4.0), enough for 'any', but rank 0's value"
            " nan would be the recorded score, and a non-finite score never wins a checkpoint",
        ),
        (  # a rank-zero-only monitor: the others have no value and no vote
            RankZero(),
            [vote(0.8, True, 0.9), vote(None, None), vote(None, None)],
            "/c/a.ckpt",
            0.8,
            True,
            "saved as a.ckpt: rank 0 voted yes (0.8 is better than its best 0.9); 'rank_zero' follows rank 0",
        ),
        (
            TwoThirds(),
            [vote(1.0, True, None, 0), vote(1.0, True, None, 0), vote(2.0, False, 1.5)],
            "/c/b.ckpt",
            1.0,
            True,
            "saved as b.ckpt: ranks 0 and 1 voted yes (its first score), rank 2 voted no; TwoThirds() decided to save",
        ),
        (  # a value that prints like its threshold gets every digit
            AllRanks(),
            [vote(0.9100001, False, 0.91)],
            None,
            0.9100001,
            False,
            "not saved: rank 0 voted no (0.9100001 is not better than its best 0.91); 'all' needs every rank",
        ),
    ],
    ids=[
        "all-no",
        "all-first",
        "any-worse",
        "any-none",
        "majority",
        "quorum",
        "nan-rank-0",
        "rank-zero",
        "custom",
        "pair",
    ],
)
def test_vote_checkpoint_reasons(
    policy: VotePolicy, ranks: list[RankView], saved_as: str | None, score: float, wanted: bool, expected: str
) -> None:
    assert topk_reason(policy, ranks, TOP1, saved_as=saved_as, score=score, wanted=wanted) == expected


def test_many_ranks_are_named_three_at_a_time() -> None:
    ranks = [vote(1.0, True, 2.0) if rank % 2 == 0 else vote(3.0, False, 2.0) for rank in range(14)]
    reason = topk_reason(AllRanks(), ranks, TOP1, saved_as=None, score=1.0, wanted=False)
    assert reason == (
        "not saved: ranks 1, 3, 5 and 4 more voted no (3.0 is not better than its best 2.0); 'all' needs every rank"
    )
    together = [vote(1.0, True, 2.0)] + [vote(3.0, False, 2.0)] * 7  # consecutive ranks as one range
    reason = topk_reason(AllRanks(), together, TOP1, saved_as=None, score=1.0, wanted=False)
    assert reason.startswith("not saved: ranks 1-7 voted no (3.0 is not better than its best 2.0);"), reason
    different = [vote(1.0, False, 0.5), vote(2.0, False, 0.5), vote(3.0, False, 0.5), vote(4.0, False, 0.5)]
    reason = topk_reason(AllRanks(), different, TOP1, saved_as=None, score=1.0, wanted=False)
    assert [f"rank {rank}:" in reason for rank in range(4)] == [True, True, True, False]  # at most three reasons


def test_worse_than_the_worst_of_a_full_top_k() -> None:
    top3 = TopKState(save_top_k=3, mode="max")
    reason = topk_reason(RankZero(), [vote(0.7, False, 0.75, 3)], top3, saved_as=None, score=0.7, wanted=False)
    assert reason == (
        "not saved: rank 0 voted no (0.7 is not better than the worst of its top 3, 0.75); 'rank_zero' follows rank 0"
    )
    keep_all = TopKState(save_top_k=-1, mode="max")
    reason = topk_reason(AnyRank(), [vote(0.7, True, None, 9)], keep_all, saved_as="/c/d.ckpt", score=0.7, wanted=True)
    assert reason == "saved as d.ckpt: rank 0 voted yes (save_top_k=-1 keeps every checkpoint); 'any' needs one rank"


def test_aggregate_checkpoint_reasons() -> None:
    state = TopKState(save_top_k=1, mode="min", kept=1, kth=4.0)
    mean = AggregatePolicy("mean")
    three = [value(3.0), value(5.0), value(3.5)]
    assert (
        topk_reason(mean, three, state, saved_as="/c/m.ckpt", score=3.8333332538604736, agreed=3.8333332538604736)
        == "saved as m.ckpt: the mean of 3 ranks' values, 3.83333, is better than the best 4.0"
    )
    assert (
        topk_reason(AggregatePolicy("min"), [value(4.5), value(6.0)], state, saved_as=None, score=4.5, agreed=4.5)
        == "not saved: the smallest value, 4.5 (rank 0), is not better than the best 4.0"
    )
    nan = [value(3.0), value(NAN)]
    assert topk_reason(AggregatePolicy("max"), nan, state, saved_as=None, score=NAN, agreed=NAN) == (
        "not saved: the largest value, nan (rank 1), is not finite, and a non-finite score never wins a checkpoint"
    )
    top3 = TopKState(save_top_k=3, mode="max", kept=2)
    assert topk_reason(mean, [value(1.0)], top3, saved_as="/c/x.ckpt", score=1.0, agreed=1.0) == (
        "saved as x.ckpt: the value, 1.0, the top 3 is not full (2 saved)"
    )


def test_early_stopping_vote_reasons() -> None:
    stop = stop_reason(
        AnyRank(),
        [vote(0.85, False, 0.91, 0), vote(0.93, True, 0.91, 3), vote(0.90, False, 0.91, 0)],
        PATIENCE_3,
        stop=True,
        wanted=True,
    )
    assert stop == (
        "stop: rank 1 asked to stop (0.93 did not improve on its best 0.91 in 3 checks, patience 3); 'any' stops when"
        " one rank asks"
    )
    go_on = stop_reason(
        Majority(),
        [vote(0.85, False, 0.91, 0), vote(0.93, False, 0.91, 1), vote(5.0, True, 0.91, 0)],
        StopState(mode="min", patience=3, divergence_threshold=3.0),
        stop=False,
        wanted=False,
    )
    assert go_on == (
        "go on: ranks 0 and 1 did not ask to stop (rank 0: 0.85 improved on its best 0.91; rank 1: 0.93 did not"
        " improve on its best 0.91, 1 of patience 3), rank 2 asked to stop; 'majority' stops when 2 of 3 ask"
    )
    threshold = StopState(mode="max", patience=3, stopping_threshold=0.99)
    assert stop_reason(
        RankZero(), [vote(0.995, True, 0.9, 0), vote(None, None)], threshold, stop=True, wanted=True
    ) == ("stop: rank 0 asked to stop (0.995 reached the stopping threshold 0.99); 'rank_zero' follows rank 0")
    nonfinite = stop_reason(
        AllRanks(), [vote(0.85, False, 0.91, 0), vote(INF, True, 0.91, 0)], PATIENCE_3, stop=True, wanted=False
    )
    assert (
        nonfinite
        == "stop: a non-finite value (inf on rank 1), and check_finite=True stops every rank whatever the policy"
    )


def test_early_stopping_aggregate_reasons() -> None:
    mean = AggregatePolicy("mean")
    ranks = [value(0.85), value(0.91)]
    improved = StopState(mode="min", patience=3, best=0.91, wait=0)
    assert stop_reason(mean, ranks, improved, stop=False, wanted=False, agreed=0.88) == (
        "go on: the mean of 2 ranks' values, 0.88, improved on the best 0.91"
    )
    exhausted = StopState(mode="min", patience=3, best=0.91, wait=3, min_delta=-0.01)
    assert stop_reason(mean, [value(0.95), value(0.91)], exhausted, stop=True, wanted=True, agreed=0.93) == (
        "stop: the mean of 2 ranks' values, 0.93, did not improve on the best 0.91 by more than 0.01 in 3 checks,"
        " patience 3"
    )


def test_a_callback_with_its_own_rule_gets_no_guessed_reason() -> None:
    own = TopKState(save_top_k=1, mode="min", stock_rule=False)
    assert topk_reason(AllRanks(), [vote(0.5, False, 0.1)], own, saved_as=None, score=0.5, wanted=False) == (
        "not saved: rank 0 voted no (its own rule said no to 0.5); 'all' needs every rank"
    )
    # the stock rule would improve here, yet the rank asked to stop (a subclass, a rounding edge): no explanation
    assert stop_reason(AnyRank(), [vote(0.5, True, 0.9, 0)], PATIENCE_3, stop=True, wanted=True) == (
        "stop: rank 0 asked to stop; 'any' stops when one rank asks"
    )
