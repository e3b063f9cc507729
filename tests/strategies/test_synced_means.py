"""Synced epoch means are exact under lightning-ext's strategies, whatever each rank's batch sizes (Lightning #21859).

Lightning 2.5/2.6 syncs a mean's batch-size count as an integer mean and truncates it, so a synced epoch mean is wrong
when the ranks' batch-size totals differ. The reference here is the weighted mean computed in the test, from every
rank's values and batch sizes, in float64.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.search import PER_SUITE_FIT, examples

SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf])


def expected(values: list[list[float]], sizes: list[list[int]]) -> tuple[float, float]:
    """The weighted mean and the sum over every rank and batch (float64; NaN and inf as IEEE arithmetic has them)."""
    weighted = sum(v * n for rank in range(len(values)) for v, n in zip(values[rank], sizes[rank], strict=True))
    count = sum(sum(rank) for rank in sizes)
    total = sum(v for rank in values for v in rank)
    return weighted / count, total


def close(actual: float, reference: float) -> bool:
    if math.isnan(reference) or math.isinf(reference):
        return math.isnan(actual) if math.isnan(reference) else actual == reference
    return math.isclose(actual, reference, rel_tol=1e-5, abs_tol=1e-5)


@st.composite
def logs(draw: st.DrawFn, world: int) -> tuple[list[list[float]], list[list[int]]]:
    batches = draw(st.integers(1, 4))
    value = st.floats(-100, 100, allow_nan=False, width=32) | (SPECIAL if draw(st.booleans()) else st.nothing())
    values = [[draw(value) for _ in range(batches)] for _ in range(world)]
    sizes = [[draw(st.integers(1, 7)) for _ in range(batches)] for _ in range(world)]
    return values, sizes


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_property_a_synced_epoch_mean_is_the_weighted_mean_of_every_rank(rank_pools: Any, world: int) -> None:
    @settings(max_examples=examples(PER_SUITE_FIT))
    @given(case=logs(world))
    def check(case: tuple[list[list[float]], list[list[int]]]) -> None:
        values, sizes = case
        outcomes = rank_pools(world).run("tests.helpers.synced_mean_tasks:fit", (values, sizes, world, False))
        mean, total = expected(values, sizes)
        for outcome in outcomes:
            assert close(outcome["mean"], mean), (outcome["mean"], mean)
            assert close(outcome["total"], total), (outcome["total"], total)

    check()


@pytest.mark.slow
def test_stock_lightning_truncates_the_count_where_lightning_ext_does_not(rank_pools: Any) -> None:
    """Rank 0 logs 1.0 with batch size 1, rank 1 logs 3.0 with batch size 2: the weighted mean is 7/3."""
    values, sizes = [[1.0], [3.0]], [[1], [2]]
    stock = rank_pools(2).run("tests.helpers.synced_mean_tasks:fit", (values, sizes, 2, True))
    ours = rank_pools(2).run("tests.helpers.synced_mean_tasks:fit", (values, sizes, 2, False))
    assert [outcome["mean"] for outcome in ours] == pytest.approx([7 / 3] * 2)
    assert [outcome["mean"] for outcome in stock] == pytest.approx([3.5] * 2)  # (1 + 6) / 2 over (1 + 2) // 2 = 1
