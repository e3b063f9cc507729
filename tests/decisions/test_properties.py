"""Property tests: random per-rank metrics through the real decision path, in real gloo process groups.

World sizes 2-4 run in persistent rank pools (one process group serves every example); world size 1 runs in this
process, where ``torch.distributed`` is not even initialised, so any collective would raise. Each property runs per
world size (:mod:`tests.helpers.search` says how many examples). Every rank's answer must
equal the single-process reference (:mod:`tests.helpers.decision_reference`: stock Lightning's own callback code per
rank and its own rule table, with no lightning_ext in it). The reference's visible state is the same for every rank, so
a rank that drifts from the others fails that comparison. Policies travel as plain specs (``"quorum:2"``); each rank
builds the lightning_ext policy from the spec (:func:`tests.helpers.decision_tasks.policy_from_spec`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch.distributed as dist
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lightning_ext._decisions.rows import Observation
from tests.helpers import decision_reference as _reference
from tests.helpers import decision_tasks as tasks
from tests.helpers.pool import RankFailure
from tests.helpers.search import PER_SUITE_CHEAP, examples

SPECIAL = [math.inf, -math.inf, math.nan]
DYADIC = st.integers(-40, 40).map(lambda n: n / 4)  # ties are common; sums are exact in any order
VALUES = st.one_of(DYADIC, DYADIC, DYADIC, st.sampled_from(SPECIAL))
NAMED = ["all", "any", "majority", "rank_zero", "mean", "min", "max"]


def every_policy(world: int) -> list[str]:
    """Each example runs every policy on the same per-rank data: the rules are tested side by side."""
    return [*NAMED, *(f"quorum:{k}" for k in range(1, world + 1)), "quorum%:75", "two_thirds"]


AGGREGATES = _reference.AGGREGATES
EXAMPLES = settings(max_examples=examples(PER_SUITE_CHEAP))  # per world size


def run_on_ranks(rank_pools: Any, world: int, target: str, per_rank: list[tuple[Any, ...]]) -> list[Any]:
    """Every rank's result; world size 1 runs here, with no process group at all."""
    if world == 1:
        assert not (dist.is_available() and dist.is_initialized())
        name = target.split(":")[1]
        function: Callable[..., Any] = getattr(tasks, name)
        return [function(*per_rank[0])]
    return rank_pools(world).run(target, *per_rank)


def _plain(value: Any) -> Any:
    """NaN-safe comparison form."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def expect_same_error(call: Callable[[], Any], world: int, fragment: str) -> None:
    if world == 1:
        with pytest.raises(Exception, match=fragment.replace("[", r"\[").replace("]", r"\]")):
            call()
        return
    with pytest.raises(RankFailure) as raised:
        call()
    messages = raised.value.messages()
    assert sorted(messages) == list(range(world)), f"not every rank raised: {messages}"
    assert len(set(messages.values())) == 1, f"ranks raised different errors: {messages}"
    assert fragment in next(iter(messages.values()))


@st.composite
def exchange_cases(draw: st.DrawFn, world: int) -> tuple[int, str, int, list[Observation]]:
    kind = draw(st.sampled_from(["vote", "mean", "min", "max"]))
    n_extras = draw(st.integers(0, 2))
    value = st.one_of(st.none(), VALUES) if draw(st.integers(0, 5)) == 0 else VALUES
    observations = [
        Observation(
            draw(value),
            draw(st.booleans()),
            tuple(draw(st.one_of(st.none(), VALUES)) for _ in range(n_extras)),
            reference=draw(st.one_of(st.none(), VALUES)),
            detail=draw(st.integers(0, 1000)),
        )
        for _ in range(world)
    ]
    return world, kind, n_extras, observations


def expected_agreement(kind: str, observations: list[Observation]) -> dict[str, Any]:
    """What one exchange must tell every rank, worked out from the observations alone (no packing, no rows)."""
    present = [obs.value is not None for obs in observations]
    expected: dict[str, Any] = {
        "presence": "all" if all(present) else "none" if not any(present) else "mixed",
        "failed": False,
        # every rank's own part, for rank 0's decision record
        "ranks": [(obs.value, obs.vote if obs.value is not None else None, obs.reference) for obs in observations],
        "extras": None,
    }
    if not all(present):
        return expected
    values: list[float] = [obs.value for obs in observations]  # type: ignore[misc]
    expected["extras"] = list(observations[0].extras)  # rank 0's file-name metrics
    expected["nonfinite"] = any(not math.isfinite(v) for v in values)
    if kind == "vote":
        votes = [obs.vote for obs in observations]
        expected.update(yes=sum(votes), rank_zero_vote=votes[0], value=values[0])
    else:
        expected["value"] = _reference.aggregate(kind, values)
    return expected


def observed_agreement(agreement: Any, expected: dict[str, Any]) -> dict[str, Any]:
    """The same keys, read from what a rank got back."""
    seen = {key: getattr(agreement, key) for key in expected if key not in ("extras", "ranks")}
    seen["extras"] = list(agreement.extras) if expected["extras"] is not None else None
    seen["ranks"] = [(view.value, view.vote, view.reference) for view in agreement.ranks]
    return seen


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_property_one_exchange_tells_every_rank_presence_votes_values_and_every_ranks_part(
    rank_pools: Any, world: int
) -> None:
    """Through a real gloo all-to-all: who has the metric, the tally, rank 0's value or the aggregate, rank 0's
    file-name metrics, whether any value is non-finite, and each rank's own value, vote and reference (what rank 0's
    decision record shows), checked against the observations themselves; every rank received the same rows."""
    EXAMPLES(given(exchange_cases(world))(lambda case: _check_exchange(rank_pools, case)))()


def _check_exchange(rank_pools: Any, case: Any) -> None:
    world, kind, n_extras, observations = case
    per_rank = [(kind, n_extras, obs) for obs in observations]
    results = run_on_ranks(rank_pools, world, "tests.helpers.decision_tasks:exchange", per_rank)
    expected = expected_agreement(kind, observations)
    for rank, (rows, agreement) in enumerate(results):
        assert rows == results[0][0], f"rank {rank} received other rows"
        assert _plain(observed_agreement(agreement, expected)) == _plain(expected), f"rank {rank}"


@st.composite
def top_k_cases(draw: st.DrawFn, world: int) -> tuple[int, str, int, list[list[Any]], list[list[Any]]]:
    mode = draw(st.sampled_from(["min", "max"]))
    save_top_k = draw(st.sampled_from([-1, 1, 2, 3]))
    epochs = draw(st.integers(1, 6))
    table: list[list[Any]] = [[None] * epochs for _ in range(world)]
    for epoch in range(epochs):
        pattern = draw(st.sampled_from(["all"] * 12 + ["none", "mixed"]))
        for rank in range(world):
            if pattern == "all" or (pattern == "mixed" and draw(st.booleans())):
                table[rank][epoch] = draw(VALUES)
    accs = [[draw(st.one_of(st.none(), DYADIC)) for _ in range(epochs)] for _ in range(world)]
    return world, mode, save_top_k, table, accs


def assert_no_non_finite_score(states: list[dict[str, Any]], where: str) -> None:
    """The README's promise, checked on what the code under test did, independently of the reference."""
    for epoch, state in enumerate(states):
        scores = list(state["best_k_models"].values())
        if state["best_model_score"] is not None:
            scores.append(state["best_model_score"])
        assert all(math.isfinite(score) for score in scores), f"{where}, epoch {epoch}: {state}"
        names = [*state["saved"], *state["best_k_models"], state["best_model_path"]]
        assert not any(bad in name for name in names for bad in ("val_loss=nan", "val_loss=inf", "val_loss=-inf"))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_property_top_k_state_matches_the_stock_reference_on_every_rank(rank_pools: Any, world: int) -> None:
    EXAMPLES(given(top_k_cases(world))(lambda case: _check_top_k(rank_pools, case)))()


def _check_top_k(rank_pools: Any, case: Any) -> None:
    world, mode, save_top_k, table, accs = case
    policies = every_policy(world)
    per_rank = [(policies, mode, save_top_k, table[rank], accs[rank]) for rank in range(world)]
    task = "tests.helpers.decision_tasks:top_k_sequences"
    run = lambda: run_on_ranks(rank_pools, world, task, per_rank)  # noqa: E731
    try:
        expected = [_reference.top_k_sequence(policy, mode, save_top_k, table, accs) for policy in policies]
    except _reference.Expected as error:  # the presence check comes before any policy
        expect_same_error(run, world, str(error))
        return
    results = run()
    for index, policy in enumerate(policies):
        for rank in range(world):
            states = results[rank][index]
            assert_no_non_finite_score(states, f"{policy}, rank {rank}")
            assert _plain(states) == _plain(expected[index][rank]), f"{policy}, rank {rank}"


@st.composite
def early_stop_cases(
    draw: st.DrawFn, world: int
) -> tuple[int, dict[str, Any], list[list[tuple[float, int]]], list[Any]]:
    config = {
        "mode": draw(st.sampled_from(["min", "max"])),
        "patience": draw(st.integers(1, 3)),
        "min_delta": draw(st.sampled_from([0.0, 0.5])),
        "check_finite": draw(st.booleans()),
        "stopping_threshold": draw(st.one_of(st.none(), DYADIC)),
        "divergence_threshold": draw(st.one_of(st.none(), DYADIC)),
        "strict": False,
    }
    # per policy, per rank: the starting (best_score, wait_count); aggregate policies share one state on every rank
    starts = []
    for policy in every_policy(world):
        if policy in AGGREGATES:
            starts.append([(draw(DYADIC), draw(st.integers(0, 3)))] * world)
        else:
            starts.append([(draw(DYADIC), draw(st.integers(0, 3))) for _ in range(world)])
    pattern = draw(st.sampled_from(["all"] * 12 + ["none", "mixed"]))
    values = [
        draw(VALUES) if pattern == "all" or (pattern == "mixed" and draw(st.booleans())) else None for _ in range(world)
    ]
    return world, config, starts, values


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_property_early_stopping_state_matches_the_stock_reference_on_every_rank(rank_pools: Any, world: int) -> None:
    EXAMPLES(given(early_stop_cases(world))(lambda case: _check_early_stop(rank_pools, case)))()


def _check_early_stop(rank_pools: Any, case: Any) -> None:
    world, config, starts, values = case
    policies = every_policy(world)
    per_rank = [(policies, config, [start[rank] for start in starts], values[rank]) for rank in range(world)]
    task = "tests.helpers.decision_tasks:early_stop_rounds"
    run = lambda: run_on_ranks(rank_pools, world, task, per_rank)  # noqa: E731
    try:
        expected = [
            _reference.early_stop_round(policy, config, start, values) for policy, start in zip(policies, starts)
        ]
    except _reference.Expected as error:
        expect_same_error(run, world, str(error))
        return
    results = run()
    for index, policy in enumerate(policies):
        for rank in range(world):
            assert _plain(results[rank][index]) == _plain(expected[index][rank]), f"{policy}, rank {rank}"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_property_arbitrary_float32_values_reduce_to_the_reference_value(rank_pools: Any, world: int) -> None:
    """Arbitrary float32 values (not only exactly summable ones): each rank reads back the mean summed in rank order,
    the exact extreme, or rank 0's exact value (vote)."""
    EXAMPLES(given(st.data())(lambda data: _check_float32(rank_pools, world, data)))()


def _check_float32(rank_pools: Any, world: int, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["mean", "min", "max", "vote"]))
    values = data.draw(st.lists(st.floats(width=32), min_size=world, max_size=world))
    assume(all(math.isfinite(v) for v in values) or kind != "mean")
    results = rank_pools(world).run(
        "tests.helpers.decision_tasks:exchange", *[(kind, 0, Observation(v, True)) for v in values]
    )
    for rank, (_, agreement) in enumerate(results):
        agreed = agreement.value
        if kind == "mean":
            assert _plain(agreed) == _plain(_reference.aggregate(kind, values)), f"rank {rank}"
        elif kind == "vote":
            assert _plain(agreed) == _plain(values[0]), f"rank {rank}"
        else:
            assert _plain(agreed) == _plain(_reference.aggregate(kind, values)), f"rank {rank}"
