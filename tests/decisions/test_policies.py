"""The policy rules, in one process."""

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
    available_policies,
    resolve_policy,
)


@st.composite
def tallies(draw: st.DrawFn) -> tuple[list[bool], VoteTally]:
    votes = draw(st.lists(st.booleans(), min_size=1, max_size=9))
    return votes, VoteTally(sum(votes), len(votes), votes[0])


@given(tallies())
def test_each_vote_policy_decides_as_defined_on_any_tally(case: tuple[list[bool], VoteTally]) -> None:
    votes, tally = case
    assert AllRanks().decide(tally) is all(votes)
    assert AnyRank().decide(tally) is any(votes)
    assert Majority().decide(tally) is (sum(votes) > len(votes) / 2)
    assert RankZero().decide(tally) is votes[0]
    for k in range(1, len(votes) + 1):
        assert Quorum(k).decide(tally) is (sum(votes) >= k)
    for percent in (1, 10, 25, 50, 66, 70, 75, 90, 99):
        # at least percent% of the ranks, rounded up, in whole-number arithmetic on the written decimal
        assert Quorum(percent / 100).decide(tally) is (100 * sum(votes) >= percent * len(votes))


@pytest.mark.parametrize(
    ("k", "world", "needed"),
    [(0.75, 4, 3), (0.75, 8, 6), (0.75, 5, 4), (0.1, 10, 1), (0.3, 10, 3), (0.7, 10, 7), (0.5, 1, 1), (0.01, 3, 1)],
)
def test_a_fraction_quorum_needs_that_share_of_the_ranks_rounded_up(k: float, world: int, needed: int) -> None:
    assert Quorum(k).needed(world) == needed  # 0.1 * 10 and 0.7 * 10 are not whole numbers in floating point
    Quorum(k).validate(world)  # a fraction can always be met


def test_a_whole_number_quorum_keeps_its_meaning_and_reprs_stay_distinct() -> None:
    assert Quorum(2).needed(100) == 2
    assert repr(Quorum(2)) == "Quorum(k=2)" and repr(Quorum(0.75)) == "Quorum(k=0.75)"
    assert Quorum(0.5) != Quorum(1) and Quorum(0.75) == Quorum(0.75)


def test_named_fraction_quorums_resolve() -> None:
    assert resolve_policy("quorum_75") == Quorum(0.75)
    assert resolve_policy("Quorum_5") == Quorum(0.05)
    for bad in ("quorum_0", "quorum_100", "quorum_075", "quorum_x"):
        with pytest.raises(ValueError, match="'quorum_<p>' for at least p% of the ranks"):
            resolve_policy(bad)


def test_majority_tie_does_not_act() -> None:
    assert Majority().decide(VoteTally(yes=2, world_size=4, rank_zero=True)) is False
    assert Majority().decide(VoteTally(yes=3, world_size=4, rank_zero=False)) is True


def test_every_policy_name_resolves_to_its_policy_object() -> None:
    assert available_policies() == ["all", "any", "majority", "max", "mean", "min", "rank_zero"]
    assert isinstance(resolve_policy("all"), AllRanks)
    assert isinstance(resolve_policy(" Majority "), Majority)
    assert resolve_policy("min") == AggregatePolicy("min")
    quorum = Quorum(2)
    assert resolve_policy(quorum) is quorum


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"Unknown decision policy 'median'.*'all', 'any', 'majority'.*'rank_zero'"):
        resolve_policy("median")


@pytest.mark.parametrize("bad", [None, 3, ["all"]])
def test_resolving_a_non_policy_is_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="must be a name or a DecisionPolicy"):
        resolve_policy(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [0, -1, True, "2", None])
def test_quorum_needs_a_positive_whole_number_or_a_fraction(k: object) -> None:
    with pytest.raises(ValueError, match="whole number of ranks k >= 1, or a fraction"):
        Quorum(k)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [0.0, 1.0, 1.5, 2.0, -0.5, float("nan"), float("inf")])
def test_a_fraction_outside_zero_to_one_says_what_to_write(k: float) -> None:
    with pytest.raises(ValueError, match=r"between 0 and 1, e.g. Quorum\(0.75\).*Quorum\(3\).*'all'"):
        Quorum(k)


def test_quorum_larger_than_world_is_rejected_at_validation() -> None:
    Quorum(3).validate(3)
    with pytest.raises(ValueError, match=r"Quorum\(k=4\) can never be met: only 3 rank"):
        Quorum(4).validate(3)


def test_aggregate_policy_rejects_an_unknown_reduction() -> None:
    with pytest.raises(ValueError, match=r"one of \['mean', 'min', 'max'\]"):
        AggregatePolicy("median")  # type: ignore[arg-type]


def test_policies_survive_pickling_and_compare_by_description() -> None:
    for name in available_policies():
        policy = resolve_policy(name)
        assert pickle.loads(pickle.dumps(policy)) == policy
    assert Quorum(2) == Quorum(2) != Quorum(3)
    assert pickle.loads(pickle.dumps(Quorum(0.75))).needed(8) == 6
    assert len({Quorum(2), Quorum(2), Majority()}) == 2


def test_user_vote_policy_resolves_decides_and_describes_itself() -> None:
    class AtLeastHalf(VotePolicy):
        def decide(self, tally: VoteTally) -> bool:
            return 2 * tally.yes >= tally.world_size

        def __repr__(self) -> str:
            return "AtLeastHalf()"

    policy = resolve_policy(AtLeastHalf())
    assert policy.kind == "vote"
    assert policy.decide(VoteTally(2, 4, False)) is True
    assert "AtLeastHalf()" in policy.describe()


def test_a_policy_says_its_kind_and_a_policy_without_one_cannot_be_made() -> None:
    """The strategies read ``kind`` to know whether the ranks vote or reduce the value first."""
    assert AggregatePolicy("mean").kind == "aggregate"
    assert resolve_policy("majority").kind == "vote"

    class Kindless(DecisionPolicy):
        pass

    class Undecided(VotePolicy):  # a vote policy of a user's that forgot its rule
        pass

    for incomplete in (Kindless, Undecided):
        with pytest.raises(TypeError, match="abstract"):
            incomplete()
