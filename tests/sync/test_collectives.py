"""Collectives per training step, counted: stock pays 2N + 1 for N synced values (a barrier and an all-reduce per
value, the SIGTERM broadcast); lightning-ext one check on its own links and one all-reduce for all of them (one reduce
op and dtype here), through Lightning's own ``strategy.reduce``; with the checks off, that all-reduce alone. With
``torch.distributed`` left alone (no checks, no stall report), Lightning's own reduce of the pack (its barrier and the
all-reduce) and its SIGTERM broadcast.

Counted with ``benchmarks.helpers.collectives.count_collectives`` (every ``torch.distributed`` call, and each check)
over ten steps; DDP's gradient all-reduce runs in C++ and is not counted in either.
"""

from __future__ import annotations

from typing import Any

import pytest

TASK = "tests.helpers.coalesce_tasks:collectives_per_step"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("count", [1, 5, 20, 128, 129])
def test_one_collective_per_step_for_any_number_of_synced_values(rank_pools: Any, count: int) -> None:
    pool = rank_pools(2)
    stock = pool.run(TASK, (True, count), timeout=120)
    ours = pool.run(TASK, (False, count), timeout=120)
    unchecked = pool.run(TASK, (False, count, {"hang_checks": False}), timeout=120)
    untouched = pool.run(TASK, (False, count, {"hang_checks": False, "stall_timeout": None}), timeout=120)
    for rank in range(2):
        assert stock[rank] == {"barrier": count, "all_reduce": count, "broadcast": 1}, stock[rank]
        assert ours[rank] == {"all_reduce": 1, "check": 1}, ours[rank]
        assert unchecked[rank] == {"all_reduce": 1}, unchecked[rank]  # the stall report's wrappers skip the barrier
        # torch.distributed left alone: Lightning's own reduce, its barrier included, and (no watchdog to carry the
        # coordinated stop) Lightning's SIGTERM broadcast
        assert untouched[rank] == {"barrier": 1, "all_reduce": 1, "broadcast": 1}, untouched[rank]
