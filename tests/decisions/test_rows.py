"""The packed row, in one process: W simulated ranks reduced with ``combine`` against an independent reference."""

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_ext._decisions.rows import Observation, RowLayout, _order_key, combine, pack, unpack
from tests.helpers.decision_reference import aggregate as reference_aggregate

SPECIAL = [math.inf, -math.inf, math.nan, 0.0, -0.0]
# dyadic values: sums are exact in any order, so the reference can demand equality
DYADIC = st.integers(-64, 64).map(lambda n: n / 4)
VALUES = st.one_of(DYADIC, st.sampled_from(SPECIAL))
MAYBE = st.one_of(st.none(), VALUES)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


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
        )
        for _ in range(world)
    ]
    return RowLayout(kind, world, with_reference=draw(st.booleans()), extras=n_extras), observations  # type: ignore[arg-type]


def check_common(layout: RowLayout, observations: list[Observation]) -> None:
    rows = [pack(layout, obs, rank=rank) for rank, obs in enumerate(observations)]
    assert all(len(row) == layout.size for row in rows)
    agreement = unpack(layout, combine(layout, rows))
    failed = any(obs.failed for obs in observations)
    assert agreement.failed is failed
    if failed:
        return
    present = [obs.value is not None for obs in observations]
    expected = "all" if all(present) else "none" if not any(present) else "mixed"
    assert agreement.presence == expected
    if expected != "all":
        return
    values = [obs.value for obs in observations]
    assert len(agreement.extras) == len(observations[0].extras)
    for got, sent in zip(agreement.extras, observations[0].extras):  # rank 0's file-name metrics
        assert (got is None and sent is None) or (got is not None and sent is not None and same(got, sent))
    if layout.kind == "vote":
        votes = [obs.vote for obs in observations]
        assert agreement.yes == sum(votes)
        assert agreement.rank_zero_vote is votes[0]
        assert agreement.nonfinite is any(not math.isfinite(v) for v in values)  # type: ignore[arg-type]
        if layout.with_reference:
            assert same(agreement.value, values[0])  # type: ignore[arg-type]
            assert math.copysign(1, agreement.value) == math.copysign(1, values[0])  # type: ignore[arg-type]
    else:
        assert same(agreement.value, reference_aggregate(layout.kind, values))  # type: ignore[arg-type]
        if layout.kind != "mean":
            assert agreement.nonfinite is any(not math.isfinite(v) for v in values)  # type: ignore[arg-type]
        else:
            assert agreement.nonfinite is (not math.isfinite(sum(values)))  # type: ignore[arg-type]


@given(rounds("vote"))
def test_vote_row_reads_back_presence_tally_rank_zero_value_and_extras(
    case: tuple[RowLayout, list[Observation]],
) -> None:
    check_common(*case)


@given(rounds("mean"))
def test_mean_row_reads_back_presence_mean_and_rank_zero_extras(case: tuple[RowLayout, list[Observation]]) -> None:
    check_common(*case)


@given(st.sampled_from(["min", "max"]).flatmap(rounds))
def test_min_max_rows_read_back_presence_extreme_and_rank_zero_extras(
    case: tuple[RowLayout, list[Observation]],
) -> None:
    check_common(*case)


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True))
def test_order_key_sorts_like_floats_with_nan_above_everything(a: float, b: float) -> None:
    if not math.isnan(a) and not math.isnan(b) and a != b:
        assert (a < b) == (_order_key(a) < _order_key(b))
    if math.isnan(a) and not math.isnan(b):
        assert _order_key(a) > _order_key(b)  # NaN wins a max


def test_vote_word_spills_into_a_second_word_instead_of_overflowing() -> None:
    # 5 digits of base W+1 must not overflow an int64 word: large worlds spill into a second word
    for world in (1, 2, 4, 8, 4096, 70000, 10**6):
        layout = RowLayout("vote", world)
        rows = [pack(layout, Observation(1.0, vote=rank % 2 == 0), rank=rank) for rank in range(min(world, 3))]
        rows += [pack(layout, Observation(1.0, vote=True), rank=3)] * (world - len(rows))
        reduced = combine(layout, rows)
        assert all(-(2**63) <= x < 2**63 for x in reduced)
        agreement = unpack(layout, reduced)
        assert agreement.presence == "all"
        assert agreement.yes == sum(1 for rank in range(min(world, 3)) if rank % 2 == 0) + (world - min(world, 3))
    assert RowLayout("vote", 4).size == 1
    assert RowLayout("vote", 70000).size == 2


def test_rows_hold_one_or_two_elements_plus_one_per_file_name_metric() -> None:
    assert RowLayout("vote", 4, with_reference=False).size == 1
    assert RowLayout("vote", 4, with_reference=True).size == 2
    assert RowLayout("mean", 4).size == RowLayout("min", 4).size == RowLayout("max", 4).size == 2
    assert RowLayout("mean", 4, extras=3).size == 5


def test_mean_layout_refuses_what_float64_cannot_carry_exactly() -> None:
    with pytest.raises(ValueError, match="file-name metrics exactly"):
        RowLayout("mean", 2**20, extras=20)


def test_nan_bits_are_canonical_and_absent_marker_is_distinct() -> None:
    odd_nan = struct.unpack("<d", struct.pack("<q", 0x7FF0000000000123))[0]
    layout = RowLayout("vote", 2, with_reference=True, extras=2)
    row = pack(layout, Observation(odd_nan, extras=(odd_nan, None)), rank=0)
    agreement = unpack(layout, combine(layout, [row, pack(layout, Observation(1.0, extras=(1.0, 1.0)), rank=1)]))
    assert math.isnan(agreement.value)
    assert agreement.extras[0] is not None and math.isnan(agreement.extras[0])
    assert agreement.extras[1] is None


def test_observation_or_row_of_the_wrong_length_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="carries 1 extras"):
        pack(RowLayout("vote", 2, extras=1), Observation(1.0), rank=0)
    with pytest.raises(ValueError, match="row of 1 elements"):
        unpack(RowLayout("vote", 2), [0, 0])
