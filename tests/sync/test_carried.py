"""Step values carried by their check (docs/synced-logging.md, "How the values ride the check").

In one process: which packs can ride, and the rounds' roles played by hand at every world size up to 70 (every rank
ends with the sum of every rank's value, once each). In real gloo groups of 1-4 ranks (a persistent pool): random packs
of every carried dtype and op, NaN and inf included, through a real check; the reference is plain Python (``math.fsum``
of the ranks' values, ``max``/``min`` with NaN kept), never lightning-ext: ints and max/min exactly, float sums exactly
at one or two ranks and within ``2 (W - 1) eps S`` beyond, and every rank with the same bits. A check whose ranks
disagree still completes its rounds (its values are not read).
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_ext._exchange_rounds import CARRY_BYTES, exchange_partners, roles
from lightning_ext._sync.carried import CarriedPacks
from tests.helpers import search
from tests.helpers.rounds import play_rounds

TASK = "tests.helpers.coalesce_tasks:carry"
_EPS = {"float32": 2.0**-23, "float64": 2.0**-52}


def test_packs_ride_only_when_every_one_can() -> None:
    floats = torch.zeros(CARRY_BYTES // 4, dtype=torch.float32)
    assert CarriedPacks.fit([(floats, "mean")])  # 128 float32 values fill the area exactly
    assert not CarriedPacks.fit([(floats, "mean"), (torch.zeros(1), "sum")])  # one more does not fit
    assert CarriedPacks.fit([(torch.zeros(3, dtype=torch.int32), "sum"), (torch.zeros(2, dtype=torch.float64), "max")])
    for dtype in (torch.float16, torch.bfloat16, torch.bool, torch.complex64):
        assert not CarriedPacks.fit([(torch.zeros(1, dtype=dtype), "sum")]), dtype
    assert not CarriedPacks.fit([(torch.zeros(1), "prod")])
    if torch.cuda.is_available():
        assert not CarriedPacks.fit([(torch.zeros(1, device="cuda"), "sum")])


def test_each_partner_reduces_in_the_lower_ranks_order_and_a_nan_is_kept() -> None:
    """Both partners of a round end with the same bits: max(-0.0, 0.0) depends on the operands' order."""
    low, high = torch.tensor([-0.0, math.nan, 1.0]), torch.tensor([0.0, 2.0, math.nan])
    ends = []
    for mine, theirs, first in ((low, high, True), (high, low, False)):
        carried, partner = CarriedPacks([(mine.clone(), "max")]), CarriedPacks([(theirs.clone(), "max")])
        carried.combine(partner.data, first=first)
        ends.append(carried.data.tobytes())
    assert ends[0] == ends[1]
    result = np.frombuffer(ends[0][:12], dtype=np.float32)
    assert result[0] == 0.0 and math.isnan(result[1]) and math.isnan(result[2])
    # the order matters: numpy's maximum of two zeros is its second operand
    assert {math.copysign(1.0, float(np.maximum(a, b))) for a, b in ((-0.0, 0.0), (0.0, -0.0))} == {-1.0, 1.0}


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_a_nan_and_a_tie_of_zeros_end_with_the_same_bits_on_both_partners(op: str) -> None:
    """inf + -inf is a NaN with the sign bit set on x86, and which NaN an addition keeps is the machine's choice."""
    low = torch.tensor([math.inf, math.nan, -0.0, 0.0, -0.0], dtype=torch.float64)
    high = torch.tensor([-math.inf, -math.nan, 0.0, -0.0, -0.0], dtype=torch.float64)
    ends = []
    for mine, theirs, first in ((low, high, True), (high, low, False)):
        carried, partner = CarriedPacks([(mine.clone(), op)]), CarriedPacks([(theirs.clone(), op)])
        carried.combine(partner.data, first=first)
        ends.append(carried.data.tobytes())
    assert ends[0] == ends[1]
    result = np.frombuffer(ends[0][:40], dtype=np.float64)
    nan = np.frombuffer(np.array([math.nan]).tobytes(), dtype=np.float64)  # the canonical quiet NaN, sign bit clear
    first = {"sum": nan, "max": np.array([math.inf]), "min": np.array([-math.inf])}[op]
    assert result[:2].tobytes() == first.tobytes() + nan.tobytes()
    signs = [math.copysign(1.0, value) for value in result[2:]]
    assert signs == {"sum": [1.0, 1.0, -1.0], "max": [1.0, 1.0, -1.0], "min": [-1.0, -1.0, -1.0]}[op]


def test_unpack_writes_the_reduced_values_back_in_place() -> None:
    tensors = [torch.tensor([1, 2], dtype=torch.int64), torch.tensor([0.5], dtype=torch.float64)]
    carried = CarriedPacks([(tensors[0], "sum"), (tensors[1], "min")])
    other = CarriedPacks([(torch.tensor([10, 20]), "sum"), (torch.tensor([-1.5], dtype=torch.float64), "min")])
    carried.combine(other.data, first=True)
    carried.unpack()
    assert tensors[0].tolist() == [11, 22] and tensors[1].tolist() == [-1.5]


@given(world=st.integers(1, 70), data=st.data())
def test_property_the_rounds_roles_give_every_rank_each_value_once(world: int, data: st.DataObject) -> None:
    """Play every rank's rounds by hand, as the exchange plays them: a round's two partners swap what they hold, and
    each does with the partner's what its role says."""
    sent = data.draw(st.lists(st.integers(-1000, 1000), min_size=world, max_size=world))
    held = list(sent)
    partners = [exchange_partners(rank, world) for rank in range(world)]
    tasks = [roles(rank, world) for rank in range(world)]

    def meet(rank: int, partner: int, mine: int, theirs: int) -> None:
        ours, their = held[rank], held[partner]
        held[rank] = {"combine": ours + their, "send": ours, "take": their}[tasks[rank][mine]]
        held[partner] = {"combine": their + ours, "send": their, "take": ours}[tasks[partner][theirs]]

    play_rounds(partners, meet)
    assert held == [sum(sent)] * world


# ---- real checks in gloo groups ------------------------------------------------------------------------------------
_VALUES = {
    "int": st.integers(-(2**40), 2**40),
    "int32": st.integers(-(2**20), 2**20),
    "float32": st.floats(-1e6, 1e6, width=32) | st.sampled_from([math.nan, math.inf, -math.inf]),
    "float64": st.floats(-1e12, 1e12) | st.sampled_from([math.nan, math.inf, -math.inf]),
}


@st.composite
def packs(draw: st.DrawFn, world: int) -> list[tuple[str, str, list[list[float]]]]:
    """Packs of every rank's values, together within what a check carries."""
    drawn, room = [], CARRY_BYTES
    for _ in range(draw(st.integers(1, 4))):
        dtype = draw(st.sampled_from(sorted(_VALUES)))
        size = 4 if dtype in ("int32", "float32") else 8
        count = draw(st.integers(1, max(1, min(12, (room - 8) // size))))
        if count * size > room:
            break
        room -= -(-count * size // 8) * 8
        op = draw(st.sampled_from(["sum", "mean", "max", "min"]))
        values = [[draw(_VALUES[dtype]) for _ in range(count)] for _ in range(world)]
        drawn.append((dtype, op, values))
    return drawn


def _reference(dtype: str, op: str, column: list[float]) -> float:
    if any(math.isnan(value) for value in column) and (op in ("max", "min") or dtype.startswith("float")):
        return math.nan
    if op in ("max", "min"):
        return float((max if op == "max" else min)(column))
    if dtype.startswith("int"):
        return float(sum(int(value) for value in column))  # the sum; the coalesced sync divides a mean afterwards
    finite = [value for value in column if math.isfinite(value)]
    if len(finite) < len(column):  # infinities: +inf, -inf, or NaN when both signs meet
        signs = {value > 0 for value in column if math.isinf(value)}
        return math.nan if len(signs) == 2 else (math.inf if signs == {True} else -math.inf)
    return math.fsum(finite)


def _same(ours: float, expected: float, dtype: str, op: str, column: list[float], world: int) -> bool:
    if math.isnan(expected):
        return math.isnan(ours)
    if ours == expected or dtype.startswith("int") or op in ("max", "min"):
        return ours == expected
    if not math.isfinite(ours):  # a float32 sum of large values may overflow where the exact sum does not
        return dtype == "float32" and abs(expected) > 3e38
    exact = float(np.float32(expected)) if dtype == "float32" else expected
    tolerance = (2 * (world - 1) + 1) * _EPS[dtype] * math.fsum(abs(value) for value in column)
    return abs(ours - exact) <= tolerance if world > 2 else ours == exact


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_property_a_check_carries_its_values_reduced_over_every_rank(rank_pools: Any, world: int) -> None:
    namespace = f"carry-test/{uuid.uuid4().hex}/"
    pool = rank_pools(world)

    @settings(max_examples=search.examples(search.PER_SUITE_CHEAP))
    @given(drawn=packs(world))
    def check(drawn: list[tuple[str, str, list[list[float]]]]) -> None:
        per_rank = [(namespace, [(dtype, op, values[rank]) for dtype, op, values in drawn]) for rank in range(world)]
        results = pool.run(TASK, *per_rank, timeout=60)
        assert all(result["agreed"] for result in results)
        assert len({tuple(result["bytes"]) for result in results}) == 1, "the ranks hold different bits"
        for index, (dtype, op, values) in enumerate(drawn):
            if dtype == "float32":  # what each rank sent: its values as float32
                values = [[float(np.float32(value)) for value in rank] for rank in values]
            for position, ours in enumerate(results[0]["values"][index]):
                column = [rank[position] for rank in values]
                expected = _reference(dtype, op, column)
                assert _same(ours, expected, dtype, op, column, world), (dtype, op, column, ours, expected)

    try:
        check()
        if world > 1:  # ranks that disagree complete the check too, and learn that they disagree
            per_rank = [(namespace, [("float32", "sum", [1.0])], False) for _ in range(world)]
            assert [result["agreed"] for result in pool.run(TASK, *per_rank, timeout=60)] == [False] * world
    finally:
        pool.run("tests.helpers.coalesce_tasks:carry_close", (namespace,))
