"""Every rank's row, in one process: W simulated ranks' rows read back with ``agree_rows`` against the observations."""

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_ext._decisions.rows import Observation, RowLayout, agree_rows, pack
from tests.helpers.decision_reference import aggregate as reference_aggregate

SPECIAL = [math.inf, -math.inf, math.nan, 0.0, -0.0]
VALUES = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(SPECIAL))
MAYBE = st.one_of(st.none(), VALUES)


def same(a: float | None, b: float | None) -> bool:
    """Equal bit for bit, but for NaN payloads (every NaN is sent as the same NaN)."""
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


@st.composite
def rounds(draw: st.DrawFn, kind: str) -> tuple[RowLayout, list[Observation]]:
    world = draw(st.integers(1, 6))
    n_extras = draw(st.integers(0, 3))
    observations = [
        Observation(
            draw(MAYBE),
            draw(st.booleans()),
            tuple(draw(MAYBE) for _ in range(n_extras)),
            draw(st.booleans()) if draw(st.integers(0, 9)) == 0 else False,
            draw(MAYBE),
            draw(st.integers(0, 2**40)),
        )
        for _ in range(world)
    ]
    return RowLayout(kind, world, extras=n_extras), observations  # type: ignore[arg-type]


def check(layout: RowLayout, observations: list[Observation]) -> None:
    rows = [pack(layout, obs, rank=rank) for rank, obs in enumerate(observations)]
    assert all(len(row) == layout.size and all(-(2**63) <= x < 2**63 for x in row) for row in rows)
    agreement = agree_rows(layout, rows)
    # every rank's own part, as it sent it
    for rank, (view, obs) in enumerate(zip(agreement.ranks, observations)):
        present = obs.value is not None and not obs.failed
        assert view.failed is obs.failed, rank
        assert same(view.value, obs.value if present else None), rank
        assert view.vote is (obs.vote if present else None), rank
        assert same(view.reference, obs.reference) and view.detail == obs.detail, rank
    assert agreement.failed is any(obs.failed for obs in observations)
    present = [obs.value is not None and not obs.failed for obs in observations]
    assert agreement.presence == ("all" if all(present) else "none" if not any(present) else "mixed")
    values = [obs.value for obs, has in zip(observations, present) if has]
    assert agreement.nonfinite is any(not math.isfinite(v) for v in values)  # type: ignore[arg-type]
    assert len(agreement.extras) == len(observations[0].extras)
    for got, sent in zip(agreement.extras, observations[0].extras):  # rank 0's file-name metrics
        assert same(got, sent)
    if layout.kind == "vote":
        votes = [obs.vote for obs, has in zip(observations, present) if has]
        assert agreement.yes == sum(votes)
        assert agreement.rank_zero_vote is (present[0] and observations[0].vote)
        assert same(agreement.value, observations[0].value if present[0] else math.nan)
    elif all(present):
        assert same(agreement.value, reference_aggregate(layout.kind, values))  # type: ignore[arg-type]
    else:
        assert math.isnan(agreement.value)


@given(st.sampled_from(["vote", "mean", "min", "max"]).flatmap(rounds))
def test_every_rank_reads_back_every_rank_and_the_agreement(case: tuple[RowLayout, list[Observation]]) -> None:
    check(*case)


def test_rows_hold_four_elements_plus_one_per_file_name_metric() -> None:
    assert RowLayout("vote", 4).size == RowLayout("mean", 4).size == RowLayout("min", 4).size == 4
    assert RowLayout("mean", 4, extras=3).size == 7
    assert RowLayout("vote", 10**6, extras=1).size == 5  # the row does not grow with the world size


def test_the_mean_is_summed_in_rank_order() -> None:
    values = [1e16, 1.0, -1e16, 1.0]  # another order gives another float
    layout = RowLayout("mean", 4)
    agreement = agree_rows(layout, [pack(layout, Observation(v), rank=r) for r, v in enumerate(values)])
    assert agreement.value == (((0 + 1e16) + 1.0) + -1e16 + 1.0) / 4


def test_nan_bits_are_canonical_and_absent_marker_is_distinct() -> None:
    odd_nan = struct.unpack("<d", struct.pack("<q", 0x7FF0000000000123))[0]
    layout = RowLayout("vote", 2, extras=2)
    row = pack(layout, Observation(odd_nan, extras=(odd_nan, None)), rank=0)
    agreement = agree_rows(layout, [row, pack(layout, Observation(1.0, extras=(1.0, 1.0)), rank=1)])
    assert agreement.value is not None and math.isnan(agreement.value)
    assert agreement.extras[0] is not None and math.isnan(agreement.extras[0])
    assert agreement.extras[1] is None
    assert agreement.ranks[0].reference is None  # none was sent


def test_observation_or_rows_of_the_wrong_length_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="carries 1 extras"):
        pack(RowLayout("vote", 2, extras=1), Observation(1.0), rank=0)
    with pytest.raises(ValueError, match="2 rows of 4 elements"):
        agree_rows(RowLayout("vote", 2), [[0, 0, 0, 0]])


def test_the_rank_is_named_when_a_row_is_packed() -> None:
    """``pack(layout, observation, 0)`` would read as any count: the rank, which decides whose extras ride, is named."""
    layout = RowLayout("mean", world_size=2)
    with pytest.raises(TypeError):
        pack(layout, Observation(1.0), 0)  # type: ignore[misc]
