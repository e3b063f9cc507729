"""The switches say what lightning-ext leaves alone, and they do (docs/architecture.md, README).

``hang_checks=False, stall_timeout=None`` leaves ``torch.distributed`` untouched: no function of it is replaced at any
time of a fit (after set-up, inside Lightning's syncs, as a thread polling beside the training sees it, after
teardown), whether the synced values sync coalesced (the packs through Lightning's own ``strategy.reduce``, its barrier
included) or per value. Where the counting wrappers are in place (the defaults, or the stall report alone), skipping
Lightning's barrier before a pack's all-reduce concerns the training thread only: a thread that calls
``dist.barrier`` on a group of its own during the syncs completes every one of its barriers on every rank.
"""

from __future__ import annotations

from typing import Any

import pytest

TASKS = "tests.helpers.switch_tasks"
UNTOUCHED = {"hang_checks": False, "stall_timeout": None}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("log_sync", ["coalesced", "per_value"])
def test_with_the_checks_and_the_stall_report_off_no_torch_distributed_function_is_ever_replaced(
    rank_pools: Any, log_sync: str
) -> None:
    pool = rank_pools(2)
    seen = pool.run(f"{TASKS}:functions_replaced", ({**UNTOUCHED, "log_sync": log_sync},), timeout=120)
    for rank in range(2):
        assert seen[rank]["syncs"] > 0, seen[rank]  # Lightning's sync ran, and was watched from inside
        assert seen[rank] == {**seen[rank], "set_up": [], "in_syncs": [], "polled": [], "after": []}, seen[rank]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_with_the_defaults_the_counting_wrappers_are_in_place_during_the_fit_and_gone_after(rank_pools: Any) -> None:
    """The other side of the switch: the wrappers are there (so the test above could see them), and go at teardown."""
    pool = rank_pools(2)
    seen = pool.run(f"{TASKS}:functions_replaced", ({},), timeout=120)
    for rank in range(2):
        assert "barrier" in seen[rank]["set_up"] and "all_reduce" in seen[rank]["in_syncs"], seen[rank]
        assert seen[rank]["after"] == [], seen[rank]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "options", [{}, {"hang_checks": False}, {"log_sync": "per_value"}], ids=["defaults", "stall_only", "per_value"]
)
def test_a_barrier_another_thread_calls_during_the_syncs_runs(rank_pools: Any, options: dict[str, Any]) -> None:
    pool = rank_pools(2)
    outcomes = pool.run(f"{TASKS}:barriers_beside_training", (options, 100, 20), timeout=150)
    assert outcomes == [{"completed": 100, "error": "", "alive": False}] * 2, outcomes
