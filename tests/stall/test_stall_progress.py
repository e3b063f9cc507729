"""No false stall: a rank that makes progress while another waits longer than ``stall_timeout`` is not reported.

The correct programs of ``tests/helpers/slow_rank_tasks.py`` in the 2-rank pool, with ``stall_timeout=1.5`` and
``on_stall="report"`` (a report never ends a pool rank), the hang checks off (so the only wait is the one the
program makes: rank 0 waits at the end of validation, in the synced epoch value's all-reduce, or in the barrier after
a checkpoint save). Rank 1 is slower by 2.4 s in all: over several validation batches, or while building a checkpoint,
it makes progress, and nothing is reported; in one validation batch it makes none, and the report says so (the rule
cuts both ways), then that the stall resolved itself. Each run ends as the same program does under stock
``DDPStrategy`` without delays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

STALL = {"strategy": "ddp", "hang_checks": False, "stall_timeout": 1.5, "on_stall": "report"}


def _delays(phase: str, seconds: float, batches: list[int | None]) -> dict[str, Any]:
    return {"delays": [{"rank": 1, "phase": phase, "how": "compute", "seconds": seconds, "epoch": 0, "batch": batch}
                       for batch in batches]}  # fmt: skip


def fit(rank_pools: Any, log_dir: Path, plan: dict[str, Any], options: dict[str, Any]) -> list[dict[str, Any]]:
    return rank_pools(2).run("tests.helpers.slow_rank_tasks:fit", (str(log_dir), plan, options, 2), timeout=120)


def assert_as_stock(ours: list[dict[str, Any]], stock: list[dict[str, Any]]) -> None:
    for mine, theirs in zip(ours, stock, strict=True):
        assert mine["error"] is None, mine["message"]
        assert (mine["global_step"], mine["weights"], mine["metrics"]) == (
            theirs["global_step"],
            theirs["weights"],
            theirs["metrics"],
        )


@pytest.fixture(scope="module")
def stock(rank_pools: Any, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return fit(rank_pools, tmp_path_factory.mktemp("stock"), {}, {"strategy": "stock"})


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "plan",
    [_delays("validation", 0.6, [0, 1, 2, 3]), _delays("checkpoint", 2.4, [None])],
    ids=["slow_validation_batches", "slow_checkpoint"],
)
def test_a_rank_that_progresses_is_never_reported(
    rank_pools: Any, tmp_path: Path, stock: list[dict[str, Any]], plan: dict[str, Any]
) -> None:
    ours = fit(rank_pools, tmp_path, plan, STALL)
    assert_as_stock(ours, stock)
    assert [outcome["stall_report"] for outcome in ours] == [None, None]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_that_makes_no_progress_is_reported_then_resolved(
    rank_pools: Any, tmp_path: Path, stock: list[dict[str, Any]]
) -> None:
    ours = fit(rank_pools, tmp_path, _delays("validation", 2.4, [1]), STALL)
    assert_as_stock(ours, stock)  # on_stall="report": the run goes on
    report = ours[0]["stall_report"]
    assert report is not None, "no stall report"
    summary = next(line for line in report.splitlines() if line.startswith("Summary: "))
    assert "Rank 1 is behind: it has made no progress for" in summary
    assert "computing in validation_step" in summary and "slow_rank_tasks.py:" in summary
    # the all-reduce of the validation step's synced values, coalesced (stock's barrier before each one is gone)
    assert "rank 0 waits for it in torch.distributed.all_reduce" in summary
    assert "resolved itself after" in report
