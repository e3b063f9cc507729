"""Bad input in real ``Trainer.fit`` runs: the same clear error on every rank, within seconds; never a hang."""

from __future__ import annotations

import time
from typing import Any

import pytest

from lightning_ext import Quorum
from lightning_ext._decisions.rows import Observation
from tests.helpers import decision_tasks as tasks
from tests.helpers.decision_scenarios import CKPT, STEP_CKPT, STEP_TABLE, TABLE_3
from tests.helpers.pool import RankFailure, RankPool, RankTimeout

pytestmark = pytest.mark.slow
STOPPING = {"monitor": "val_loss", "patience": 1, "mode": "min"}


def same_error_everywhere(raised: RankFailure, world: int, *fragments: str) -> str:
    messages = raised.messages()
    assert sorted(messages) == list(range(world)), f"not every rank raised: {sorted(messages)}"
    assert len(set(messages.values())) == 1, f"ranks raised different errors: {messages}"
    message = next(iter(messages.values()))
    for fragment in fragments:
        assert fragment in message, message
    return message


def assert_group_in_step(pool: RankPool) -> None:
    """A real exchange through the pool's process group gives every rank the right tally: the group still works and
    its ranks are in step (a rank still inside an earlier collective would hang this one, by its deadline)."""
    world = pool.world_size
    per_rank = [("vote", 0, Observation(float(rank), vote=rank % 2 == 0)) for rank in range(world)]
    results = pool.run("tests.helpers.decision_tasks:exchange", *per_rank, timeout=30)
    for rank, (_, agreement) in enumerate(results):
        assert (agreement.presence, agreement.yes, agreement.value) == ("all", (world + 1) // 2, 0.0), f"rank {rank}"


@pytest.mark.parametrize("callback", ["checkpoint", "early_stopping"])
@pytest.mark.parametrize("policy", ["all", pytest.param("mean", marks=pytest.mark.both_packages)])
def test_metric_logged_on_rank_zero_only_is_one_error_on_every_rank(
    rank_pools: Any, tmp_path: Any, callback: str, policy: str
) -> None:
    pool = rank_pools(3)
    assert_group_in_step(pool)  # started, and in step, before
    starts = pool.starts
    options = {"checkpoint": CKPT} if callback == "checkpoint" else {"early_stopping": STOPPING}
    strategy = {"checkpoint_policy": policy, "early_stopping_policy": policy}
    with pytest.raises(RankFailure) as raised:  # a hang would be a RankTimeout at the deadline, not a RankFailure
        pool.run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path), strategy, TABLE_3),
            log_on="rank_zero",
            timeout=60,
            **options,
        )
    option = "checkpoint_policy" if callback == "checkpoint" else "early_stopping_policy"
    same_error_everywhere(
        raised.value,
        3,
        "MonitorMissingError",
        "'val_loss'",
        "missing on ranks 1 and 2",
        "logged on rank 0",
        f"Under {option}='{policy}' every rank decides with its own value",
        f"use {option}='rank_zero': rank 0's value then decides for every rank",
    )
    # the same process group carries on: every rank left the failed decision at the same point
    assert_group_in_step(pool)
    assert pool.starts == starts


def test_a_metric_logged_on_rank_zero_only_decides_under_rank_zero(rank_pools: Any, tmp_path: Any) -> None:
    """``self.log(..., rank_zero_only=True)`` under ``if self.trainer.is_global_zero:``: rank 0's own values decide,
    every rank ends with the same paths. Rank 0 sees 4, 3, 3.5: saves at epochs 0 and 1; EarlyStopping(patience=1)
    stops at epoch 2 (3.5 does not improve on 3)."""
    pool = rank_pools(3)
    strategy = {"checkpoint_policy": "rank_zero", "early_stopping_policy": "rank_zero"}
    results = pool.run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path), strategy, TABLE_3),
        log_on="rank_zero",
        checkpoint=CKPT,
        early_stopping=STOPPING,
        timeout=90,
    )
    for result in results:
        assert result["saves"] == ["epoch=0-val_loss=4.00.ckpt", "epoch=1-val_loss=3.00.ckpt"], result
        assert (result["best_model_path"], result["best_model_score"]) == ("epoch=1-val_loss=3.00.ckpt", 3.0)
        assert (result["should_stop"], result["stopped_epoch"]) == (True, 2), result
    assert results[0]["files"] == ["epoch=1-val_loss=3.00.ckpt"]


def test_a_step_metric_logged_on_rank_zero_only_saves_on_every_rank_under_rank_zero(
    rank_pools: Any, tmp_path: Any
) -> None:
    """A step-based save of a metric only rank 0 logs: ModelCheckpoint's own check for the metric, made on each rank
    alone, would defer the save on rank 1 while rank 0 saves (a hang in the save's barrier); every rank saves alike.
    Rank 0's train_metric per step: 4, 3, 3.5, 2, 2.5 (save_top_k=1)."""
    results = rank_pools(2).run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path), {"checkpoint_policy": "rank_zero"}, []),
        log_on="rank_zero",
        checkpoint=STEP_CKPT,
        train_table=STEP_TABLE,
        max_epochs=5,
        timeout=90,
    )
    expected = ["step=1-train_metric=4.00.ckpt", "step=2-train_metric=3.00.ckpt", "step=4-train_metric=2.00.ckpt"]
    assert [result["saves"] for result in results] == [expected, expected]
    assert results[0]["files"] == ["step=4-train_metric=2.00.ckpt"]


def test_stock_ddp_hangs_where_the_policy_strategy_raises(rank_pools: Any, tmp_path: Any) -> None:
    """Side by side: stock ranks 1 and 2 raise and leave rank 0 waiting in a collective forever."""
    pool = rank_pools(3)
    assert_group_in_step(pool)  # started, and in step, before
    starts = pool.starts
    with pytest.raises(RankFailure) as raised:
        pool.run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path), "stock", TABLE_3),
            log_on="rank_zero",
            checkpoint=CKPT,
            timeout=60,
        )
    assert sorted(raised.value.failures) == [1, 2]  # rank 0 never answered: the pool had to be killed
    assert "ranks [0] never answered" in str(raised.value)
    assert_group_in_step(pool)  # a fresh pool (a new process group) takes its place
    assert pool.starts == starts + 1


@pytest.mark.both_packages
def test_metric_missing_on_every_rank_keeps_the_stock_error_on_every_rank(rank_pools: Any, tmp_path: Any) -> None:
    pool = rank_pools(2)
    with pytest.raises(RankFailure) as raised:
        pool.run(
            "tests.helpers.decision_scenarios:fit", (str(tmp_path), {}, TABLE_3[:2]), log_on="none", checkpoint=CKPT
        )
    same_error_everywhere(raised.value, 2, "could not find the monitored key")
    with pytest.raises(RankFailure) as raised:
        pool.run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path), {}, TABLE_3[:2]),
            log_on="none",
            early_stopping=STOPPING,
        )
    same_error_everywhere(raised.value, 2, "Early stopping conditioned on metric `val_loss` which is not available")
    lenient = dict(STOPPING, strict=False)
    results = pool.run(
        "tests.helpers.decision_scenarios:fit", (str(tmp_path), {}, TABLE_3[:2]), log_on="none", early_stopping=lenient
    )
    assert [r["should_stop"] for r in results] == [False, False]  # strict=False: skipped on every rank, no hang


@pytest.mark.both_packages
def test_ranks_configured_with_different_policies_fail_at_set_up(rank_pools: Any, tmp_path: Any) -> None:
    pool = rank_pools(2)
    per_rank = [
        (str(tmp_path), {"checkpoint_policy": "mean"}, TABLE_3[:2]),
        (str(tmp_path), {"checkpoint_policy": Quorum(2)}, TABLE_3[:2]),
    ]
    with pytest.raises(RankFailure) as raised:
        pool.run("tests.helpers.decision_scenarios:fit", *per_rank, checkpoint=CKPT)
    message = same_error_everywhere(raised.value, 2)
    assert message.splitlines()[0] == (
        "PolicyMismatchError: The strategy's checkpoint_policy differs between ranks: AggregatePolicy('mean') on rank"
        " 0, but Quorum(k=2) on rank 1. Fix: pass the same options on every rank."
    )


def test_ranks_that_differ_in_one_option_alone_are_told_which(rank_pools: Any, tmp_path: Any) -> None:
    """The options are compared by name (``StrategyOptions``' fields), so the last option differing alone is named."""
    per_rank = [(str(tmp_path), {"log_sync": sync}, TABLE_3[:2]) for sync in ("coalesced", "per_value")]
    with pytest.raises(RankFailure) as raised:
        rank_pools(2).run("tests.helpers.decision_scenarios:fit", *per_rank, checkpoint=CKPT)
    first, *details = same_error_everywhere(raised.value, 2).splitlines()
    assert first == (
        "PolicyMismatchError: The strategy's log_sync differs between ranks: 'coalesced' on rank 0, but 'per_value'"
        " on rank 1. Fix: pass the same options on every rank."
    )
    assert details == ["  log_sync: 'coalesced' on rank 0; 'per_value' on rank 1"]


@pytest.mark.both_packages
def test_quorum_larger_than_the_world_fails_at_set_up_on_every_rank(rank_pools: Any, tmp_path: Any) -> None:
    with pytest.raises(RankFailure) as raised:
        rank_pools(2).run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path), {"checkpoint_policy": Quorum(3)}, TABLE_3[:2]),
            checkpoint=CKPT,
        )
    same_error_everywhere(raised.value, 2, "Quorum(k=3) can never be met: only 2 rank(s) vote")


@pytest.mark.both_packages
def test_policy_that_does_not_return_a_bool_is_one_error_on_every_rank(rank_pools: Any, tmp_path: Any) -> None:
    with pytest.raises(RankFailure) as raised:
        rank_pools(2).run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path), {"checkpoint_policy": tasks.UndecidedPolicy()}, TABLE_3[:2]),
            checkpoint=CKPT,
        )
    same_error_everywhere(
        raised.value, 2, "UndecidedPolicy().decide(", "returned None of type NoneType", "must return a bool"
    )


@pytest.mark.both_packages
def test_local_decision_that_is_not_a_bool_is_one_error_on_every_rank(rank_pools: Any, tmp_path: Any) -> None:
    with pytest.raises(RankFailure) as raised:
        rank_pools(3).run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path), {}, TABLE_3),
            checkpoint=CKPT,
            checkpoint_class="FlakyCheckpoint",
        )
    same_error_everywhere(
        raised.value,
        3,
        "LocalDecisionError",
        "FlakyCheckpoint(monitor='val_loss') could not make its cross-rank decision",
        "rank 1: TypeError: FlakyCheckpoint.check_monitor_top_k returned 'yes' of type str",
    )


def test_pool_reports_a_hang_by_its_deadline(rank_pools: Any) -> None:
    """The harness itself: a rank that never answers fails the call by its deadline."""
    pool = rank_pools(2)
    started = time.monotonic()
    with pytest.raises(RankTimeout, match=r"rank\(s\) \[0, 1\] did not answer within 3s"):
        pool.run("time:sleep", (600,), timeout=3)
    # by its deadline, not when the ranks' 10-minute sleep ends: so generous only a hang of the harness breaks it
    assert time.monotonic() - started < 300


@pytest.mark.both_packages
def test_step_based_checkpoint_with_metric_on_rank_zero_only_is_one_error_on_every_rank(
    rank_pools: Any, tmp_path: Any
) -> None:
    """Lightning defers a due step-based save on each rank that lacks the metric, alone: a deadlock in stock."""
    with pytest.raises(RankFailure) as raised:  # a hang would be a RankTimeout at the deadline, not a RankFailure
        rank_pools(2).run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path), {}, []),
            checkpoint=STEP_CKPT,
            train_table=STEP_TABLE,
            log_on="rank_zero",
            max_epochs=3,
            timeout=60,
        )
    same_error_everywhere(raised.value, 2, "MonitorMissingError", "'train_metric'", "missing on rank 1")
