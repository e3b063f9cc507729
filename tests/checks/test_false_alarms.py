"""No false alarms: correct programs with one rank slower than every threshold of the hang checks end as stock does.

Each program of ``tests/helpers/slow_rank_tasks.py`` is correct whatever the timing. One rank is made slower than the
others in one phase, by real computation or by sleeping, while the other ranks go on to a hang check and wait there.
In the rank pools the checks look at the other ranks after 0.2 s and then every 0.1 s (instead of 2 s and 1 s), so a
delay of under a second is many looks long; the launched jobs of ``test_slow_rank_launched.py`` keep the real
thresholds. The reference is the same program under stock ``DDPStrategy``, without any delay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import search
from tests.helpers.slow_rank_tasks import BATCHES, PHASES

FAST_WAITS = (0.2, 0.1)  # first look, between looks (seconds), in the pool
SLOW = 0.8  # seconds: several looks long


def fit(
    rank_pools: Any, world: int, log_dir: Path, plan: dict[str, Any] | None, **options: Any
) -> list[dict[str, Any]]:
    return rank_pools(world).run(
        "tests.helpers.slow_rank_tasks:fit", (str(log_dir), plan, options, world, FAST_WAITS), timeout=120
    )


_REFERENCES: dict[tuple[int, int, bool], list[dict[str, Any]]] = {}


def stock(
    rank_pools: Any, world: int, tmp_path: Path, accumulate: int = 1, buffers: bool = False
) -> list[dict[str, Any]]:
    """The program under stock DDPStrategy, without delays (computed once per world size, accumulation and model)."""
    key = (world, accumulate, buffers)
    if key not in _REFERENCES:
        plan = {"accumulate": accumulate, "buffers": buffers}
        _REFERENCES[key] = fit(rank_pools, world, tmp_path / "stock", plan, strategy="stock")
    return _REFERENCES[key]


def assert_same_as_stock(ours: list[dict[str, Any]], reference: list[dict[str, Any]]) -> None:
    for mine, theirs in zip(ours, reference, strict=True):
        assert mine["error"] is None, mine["message"]
        assert mine["stall_report"] is None, mine["stall_report"]  # the default stall_timeout never reports these
        assert (mine["global_step"], mine["weights"]) == (theirs["global_step"], theirs["weights"])
        assert mine["metrics"] == theirs["metrics"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["compute", "sleep"])
@pytest.mark.parametrize("phase", PHASES)
def test_a_rank_slow_in_any_phase_is_waited_for(rank_pools: Any, tmp_path: Path, phase: str, how: str) -> None:
    accumulate = 2 if phase == "backward_accumulating" else 1
    batch = 0 if phase in ("first_batch", "backward_accumulating") else 1
    delays = [{"rank": 1, "phase": phase, "how": how, "seconds": SLOW, "epoch": 0, "batch": batch}]
    ours = fit(rank_pools, 2, tmp_path / "ours", {"delays": delays, "accumulate": accumulate})
    assert_same_as_stock(ours, stock(rank_pools, 2, tmp_path, accumulate))
    if phase != "data":  # a slow training fetch is waited for in Lightning's own per-step broadcast, not at a check
        assert any(outcome["looks"] for outcome in ours), "no rank waited long enough at a check to look"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_check_that_completes_while_a_rank_looks_is_not_a_deadlock(rank_pools: Any, tmp_path: Path) -> None:
    """The look takes a second: meanwhile the slow rank arrives, the check completes, and the slow rank goes on into
    the synced value's all-reduce, a collective call the looking rank has not made yet; its facts must not be read as
    a deadlock (the rank has passed the check)."""
    delays = [{"rank": 1, "phase": "forward", "how": "sleep", "seconds": 0.4, "epoch": 0, "batch": 1}]
    ours = fit(rank_pools, 2, tmp_path / "ours", {"delays": delays, "slow_looks": 1.0})
    assert_same_as_stock(ours, stock(rank_pools, 2, tmp_path))
    assert any(outcome["looks"] for outcome in ours)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("batch", [0, 1])
@pytest.mark.parametrize("slow", ["first", "last"])
def test_a_rank_slow_in_a_forward_pass_that_broadcasts_is_waited_for(
    rank_pools: Any, tmp_path: Path, world: int, batch: int, slow: str
) -> None:
    """With a BatchNorm layer, DDP broadcasts the buffers at each forward pass, and the rebuilt buckets' order at the
    second (batch 1): the hang checks record these passes. One rank computes (matrix products) in its forward pass,
    several looks long, while the others wait at the check of the step's synced log; rank 0 (which sends the
    broadcasts) or the last rank."""
    rank = 0 if slow == "first" else world - 1
    delays = [{"rank": rank, "phase": "forward", "how": "compute", "seconds": SLOW, "epoch": 0, "batch": batch}]
    ours = fit(rank_pools, world, tmp_path / "ours", {"delays": delays, "buffers": True})
    assert_same_as_stock(ours, stock(rank_pools, world, tmp_path, buffers=True))
    assert any(outcome["looks"] for outcome in ours), "no rank waited long enough at a check to look"


@st.composite
def delay_plans(draw: st.DrawFn, world: int) -> dict[str, Any]:
    """Random delays: any rank, any phase, any batch of either epoch, by computing or sleeping."""
    delays = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "rank": st.integers(0, world - 1),
                    "phase": st.sampled_from(PHASES),
                    "how": st.sampled_from(["compute", "sleep"]),
                    "seconds": st.sampled_from([0.05, 0.3, 0.5]),
                    "epoch": st.integers(0, 1),
                    "batch": st.integers(0, BATCHES - 1),
                }
            ),
            min_size=1,
            max_size=3,
        )
    )
    return {"delays": delays, "accumulate": draw(st.sampled_from([1, 2])), "buffers": draw(st.booleans())}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_property_random_delays_never_change_the_outcome(rank_pools: Any, tmp_path: Path, world: int) -> None:
    examples = search.examples(search.PER_SUITE_FIT)

    @settings(max_examples=examples)
    @given(plan=delay_plans(world))
    def check(plan: dict[str, Any]) -> None:
        root = tmp_path / f"example{len(list(tmp_path.iterdir()))}"
        ours = fit(rank_pools, world, root, plan)
        assert_same_as_stock(ours, stock(rank_pools, world, tmp_path, plan["accumulate"], plan["buffers"]))

    check()
