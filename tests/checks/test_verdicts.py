"""The pure parts of the hang checks, in one process: the deadlock rule, the causes the messages name, the exchange.

Facts are written by hand here, as the ranks would report them; the expectations follow from the rule's statement
(``docs/hang-checks.md``), not from running it.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_ext import errors
from lightning_ext._checks.messages import describe_deadlock, describe_divergence
from lightning_ext._checks.points import Point
from lightning_ext._checks.verdict import blocked_by, deadlock, diagnosed
from lightning_ext._exchange_rounds import exchange_partners
from lightning_ext._watch.progress import Progress
from lightning_ext._watch.rank_facts import Call, Facts
from tests.helpers.rounds import play_rounds

CALL = "self.log('x', sync_dist=True)"
ENTRY = {"name": "x", "fx": "training_step", "dataloader": None, "reduce": "mean", "site": "/p/m.py:9 in training_step"}
ENTRY["call"] = CALL
LOG = Point("log", ("log", "step", "training_step", "x", None, 0), f"{CALL} (step value)", ENTRY, call=CALL)
LOG = dataclasses.replace(LOG, site=ENTRY["site"])


def waiting(rank: int = 0, counts: int = 10, backwards: int = 3, batches: int = 5, **more: object) -> Facts:
    return Facts(rank, check=(5, LOG.where), counts={"world": counts}, backwards=backwards, batches=batches, **more)  # type: ignore[arg-type]


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


# ---- the deadlock rule -----------------------------------------------------------------------------------------------
def test_a_rank_computing_anywhere_is_waited_for() -> None:
    assert blocked_by([waiting()], Facts(1, counts={"world": 10}, backwards=3)) is None
    # in a backward pass without gradient sync (gradient accumulation), however long
    assert blocked_by([waiting()], Facts(1, counts={"world": 10}, backwards=3, backward=None)) is None


def test_a_synced_backward_pass_the_waiting_ranks_have_made_is_waited_for() -> None:
    """The fast rank finished backward #4; the slow one is still computing in it: its all-reduces are matched."""
    assert blocked_by([waiting(backwards=4)], Facts(1, counts={"world": 10}, backward=4, backwards=3)) is None


def test_a_synced_backward_pass_the_waiting_ranks_have_not_made_cannot_end() -> None:
    assert blocked_by([waiting(backwards=3)], Facts(1, counts={"world": 10}, backward=4, backwards=3)) == "backward"


def test_a_collective_call_is_blocking_only_beyond_a_waiting_rank_s_count() -> None:
    made = Call("world", 10, "torch.distributed.all_gather", "m.py:3 in f")
    extra = Call("world", 11, "torch.distributed.all_gather", "m.py:3 in f")
    assert blocked_by([waiting(counts=10)], Facts(1, counts={"world": 10}, inside=made)) is None
    assert blocked_by([waiting(counts=10)], Facts(1, counts={"world": 11}, inside=extra)) == "collective"
    # with two waiting ranks, the one with fewer calls decides
    assert blocked_by([waiting(0, counts=11), waiting(2, counts=10)], Facts(1, inside=extra)) == "collective"
    # a call on another group compares with that group's counts
    other = Call("tp", 3, "torch.distributed.all_reduce", "m.py:4 in g")
    assert blocked_by([Facts(0, counts={"world": 99, "tp": 3})], Facts(1, inside=other)) is None
    assert blocked_by([Facts(0, counts={"world": 99, "tp": 2})], Facts(1, inside=other)) == "collective"


def test_without_waiting_ranks_nothing_is_proven() -> None:
    assert blocked_by([], Facts(1, backward=9)) is None


# ---- the cause each message names: its first line ------------------------------------------------------------------
def test_a_signal_is_named_first() -> None:
    error = describe_deadlock(LOG, [waiting()], [Facts(1, backward=4, signal="SIGTERM in training of epoch 0")])
    assert isinstance(error, errors.RankSignalledError)
    assert first_line(error).startswith("Rank 1 received SIGTERM in training of epoch 0, and the other ranks did not")


def test_a_stream_that_ran_out_on_one_rank_is_uneven_data() -> None:
    done = Progress("validate", 0, train_batches=4, train_done=True)  # validating at the end of its epoch
    going = Progress("train", 0, train_batches=4, train_done=False)  # Lightning fetched its 5th batch already
    call = Call("world", 17, "torch.distributed.broadcast", "job.py:1 in main", lightning=True)
    error = describe_deadlock(LOG, [waiting(progress=done)], [Facts(1, inside=call, progress=going)])
    assert isinstance(error, errors.UnevenBatchesError)
    assert first_line(error) == (
        "Uneven data in epoch 0: the train dataloader ran out after 4 batch(es) on rank 0 while rank 1 had more."
        " Fix: as many batches on every rank."
    )
    assert "  rank 1: 4 training batch(es) so far, and more to come" in str(error)


def test_a_stream_one_batch_short_names_the_short_rank_not_the_one_behind_in_time() -> None:
    """Issue 29's case: rank 3 of 4 yields one batch fewer; rank 1 is only slower (4 so far, its 5th fetched)."""
    ended = {0: 5, 2: 5, 3: 4}
    progress = [
        Progress("validate", 0, train_batches=ended[rank], train_done=True)
        if rank in ended
        else Progress("train", 0, train_batches=4)
        for rank in range(4)
    ]
    points = [dataclasses.replace(LOG, facts=Facts(rank, progress=progress[rank])) for rank in range(4)]
    error = describe_divergence(points)
    assert isinstance(error, errors.UnevenBatchesError)
    assert first_line(error).startswith(
        "Uneven data in epoch 0: the train dataloader ran out after 4 batch(es) on rank 3 but after 5 on ranks 0 and 2."
    )


@pytest.mark.parametrize(
    ("elsewhere", "batches"),
    [
        (Progress("sanity_check", 0, eval_batches=(1,), hook="validation_step"), 1),
        (Progress("validate", 0, train_batches=4, eval_batches=(2,), hook="validation_step"), 6),
    ],
    ids=["in the sanity check", "in a validation in the middle of the epoch"],
)
def test_a_rank_that_is_elsewhere_with_data_left_is_not_uneven_data(elsewhere: Progress, batches: int) -> None:
    """A rank blocked in a rank-guarded broadcast in validation_step while another went on into training: the
    broadcast is named, not the training data (whose loader has not run out on any rank)."""
    going = Progress("train", 0, train_batches=5, hook="training_step")
    call = Call("world", 3, "torch.distributed.broadcast (via Trainer.log_dir)", "/p/job.py:36 in validation_step")
    blocked = Facts(0, inside=call, progress=elsewhere, batches=batches)
    error = describe_deadlock(LOG, [Facts(1, progress=going, batches=batches + 4)], [blocked])
    assert isinstance(error, errors.DivergentCollectiveError), error
    sanity = "sanity check, " if elsewhere.stage == "sanity_check" else ""
    assert first_line(error) == (
        f"torch.distributed.broadcast (via Trainer.log_dir) in validation_step ({sanity}job.py:36) ran on rank 0"
        " only; rank 1 went on. Fix: call it on every rank."
    )


def test_equal_progress_is_not_uneven_data() -> None:
    same = Progress("train", 0, train_batches=2)
    error = describe_deadlock(LOG, [waiting(progress=same)], [Facts(1, backward=4, progress=same)])
    assert isinstance(error, errors.DivergentLoggingError)
    assert "Uneven data" not in str(error)


def test_a_rank_blocked_in_a_collective_call_names_that_call_and_its_line() -> None:
    """Rank 1 is blocked in an all_gather at batch 5; rank 0 went past it, to a synced log at batch 6."""
    name = "torch.distributed.all_gather (via LightningModule.all_gather)"
    call = Call("world", 11, name, "/p/m.py:40 in validation_step")
    blocked = Facts(1, inside=call, batches=5, progress=Progress("validate", 0, hook="validation_step"))
    error = describe_deadlock(LOG, [waiting(batches=6)], [blocked])
    assert isinstance(error, errors.DivergentCollectiveError)
    assert first_line(error).startswith(f"{name} in validation_step (m.py:40) ran on rank 1 only; rank 0 went on")
    assert f"  rank 1: blocked in {name} called from /p/m.py:40 in validation_step (its call #11 on the default" in str(
        error
    )


def test_a_rank_in_backward_blames_the_waiting_ranks_extra_log() -> None:
    error = describe_deadlock(LOG, [waiting()], [Facts(1, backward=4, batches=5)])
    assert isinstance(error, errors.DivergentLoggingError)
    assert first_line(error) == (
        "self.log('x', sync_dist=True) in training_step (m.py:9) synced on rank 0 only; rank 1 went on."
        " Fix: log it on every rank, or with rank_zero_only=True."
    )


def test_a_lightning_call_that_every_rank_makes_is_never_the_culprit() -> None:
    """Rank 1 went on to the next batch, into Lightning's per-step broadcast; rank 0 logs in on_train_batch_end."""
    flow = Call("world", 9, "torch.distributed.broadcast (via _TrainingEpochLoop.advance, in Trainer.fit)", "j.py:3")
    logged = dataclasses.replace(LOG, detail={**ENTRY, "fx": "on_train_batch_end"})
    error = describe_deadlock(logged, [waiting()], [Facts(1, inside=dataclasses.replace(flow, lightning=True))])
    assert isinstance(error, errors.DivergentLoggingError)
    assert first_line(error).startswith("self.log('x', sync_dist=True) in on_train_batch_end (m.py:9) synced on rank 0")


def test_ranks_at_the_same_point_with_different_collective_calls_name_the_extra_call() -> None:
    extra = Call("world", 8, "torch.distributed.broadcast", "/p/handler.py:5 in on_term")
    points = [
        dataclasses.replace(LOG, facts=Facts(0, counts={"world": 7})),
        dataclasses.replace(LOG, facts=Facts(1, counts={"world": 8}, recent=(extra,))),
    ]
    error = describe_divergence(points)
    assert isinstance(error, errors.DivergentCollectiveError)
    assert first_line(error).startswith(
        "torch.distributed.broadcast (handler.py:5) ran on rank 1 only; rank 0 went on."
    )


def test_a_torchmetrics_metric_gets_advice_that_works() -> None:
    entry = {"name": "acc", "fx": "validation_step", "dataloader": None, "reduce": "metric", "site": "/p/m.py:2 in v"}
    entry["call"] = "self.log('acc', <metric>)"
    points = [
        Point("epoch_logs", ("epoch_logs", ("a",)), "round", [entry], facts=Facts(0, batches=3)),
        Point("epoch_logs", ("epoch_logs", ()), "round", [], facts=Facts(1, batches=3)),
    ]
    error = describe_divergence(points)
    assert isinstance(error, errors.DivergentLoggingError)
    assert first_line(error) == (
        "self.log('acc', <metric>) in validation_step (m.py:2) synced on rank 0 only; rank 1 did not sync it."
        " Fix: update and log the metric on every rank."
    )
    assert "rank_zero_only=True` does not stop a metric object from syncing" in str(error)


# ---- the exchange's rounds -------------------------------------------------------------------------------------------
@given(world=st.integers(1, 70), values=st.data())
def test_property_every_rank_learns_the_smallest_and_largest_value(world: int, values: st.DataObject) -> None:
    """Play the rounds of every rank by hand: messages pair up per pair of ranks, in order, and everyone learns all."""
    sent = values.draw(st.lists(st.integers(-5, 5), min_size=world, max_size=world))
    low, high = list(sent), list(sent)
    plans = [exchange_partners(rank, world) for rank in range(world)]
    for rank, plan in enumerate(plans):  # each pair of ranks exchanges the same number of times
        for partner in set(plan):
            assert plan.count(partner) == plans[partner].count(rank)

    def meet(rank: int, partner: int, _: int, __: int) -> None:
        low[rank] = low[partner] = min(low[rank], low[partner])
        high[rank] = high[partner] = max(high[rank], high[partner])

    play_rounds(plans, meet)
    assert low == [min(sent)] * world and high == [max(sent)] * world
    assert all(len(plan) <= world.bit_length() + 1 for plan in plans)  # ceil(log2 W) rounds, two more folding


def test_a_rank_that_passed_the_check_proves_it_is_completing() -> None:
    """Its facts may show it inside the synced value's all-reduce that follows the check, beyond the waiting rank's
    count, while the waiting rank has not yet seen its own exchange complete: not a deadlock (found under load)."""
    call = Call("world", 17, "torch.distributed.all_reduce (via LightningModule.log)", "m.py:9 in on_train_batch_end")
    waiting_rank = Facts(0, check=(5, LOG.where), checks=4, counts={"world": 16})
    assert deadlock(5, [waiting_rank, Facts(1, checks=5, counts={"world": 17}, inside=call)]) is None
    assert deadlock(5, [waiting_rank, Facts(1, checks=4, counts={"world": 17}, inside=call)]) is not None
    # a rank waiting in the same check is not missing, and a rank computing is not blocked
    assert deadlock(5, [waiting_rank, Facts(1, check=(5, LOG.where), checks=4)]) is None
    assert deadlock(5, [waiting_rank, Facts(1, checks=4, counts={"world": 16})]) is None


def test_the_diagnosis_judges_the_check_its_own_rank_waits_in_once_every_other_rank_answered() -> None:
    """Rank 0 waits in check 5 (its 5th); rank 1 passed check 4 and is in a synced backward pass rank 0 has not made."""
    mine = Facts(0, check=(5, LOG.where), checks=4, counts={"world": 16}, backwards=3)
    blocked = Facts(1, checks=4, counts={"world": 16}, backward=4, backwards=3)
    assert diagnosed(mine, {1: blocked}, world_size=2) == ([mine], [blocked])
    # rank 1 has passed check 5: it is completing, whatever else its facts say
    assert diagnosed(mine, {1: dataclasses.replace(blocked, checks=5)}, world_size=2) is None
    # a third rank did not answer: it proves nothing (its process may be gone), and neither do the others
    assert diagnosed(mine, {1: blocked}, world_size=3) is None
    assert diagnosed(mine, {1: blocked, 2: dataclasses.replace(blocked, rank=2)}, world_size=3) is not None
    # a rank that waits in no check (its check completed meanwhile) diagnoses nothing
    assert diagnosed(dataclasses.replace(mine, check=None), {1: blocked}, world_size=2) is None


class _LateWork:
    """A collective's work that completes just after a wait timed out (the race ``wait_for`` must survive)."""

    def __init__(self, fails: bool = False) -> None:
        self.waits, self.fails = 0, fails

    def wait(self, timeout: object = None) -> bool:
        self.waits += 1
        if timeout is not None:
            raise RuntimeError("Operation timed out!")
        if self.fails:
            raise RuntimeError("Connection closed by peer")
        return True

    def is_completed(self) -> bool:
        return True


def test_a_wait_that_times_out_as_the_work_completes_reports_it_completed() -> None:
    from lightning_ext._collective import wait_for

    assert wait_for(_LateWork(), 0.0) is True
    with pytest.raises(RuntimeError, match="Connection closed by peer"):  # the collective's own error, not the timeout
        wait_for(_LateWork(fails=True), 0.0)
