"""Who the first line names when the ranks part ways (docs/hang-checks.md, "Who is named"), rule by rule, in one
process: how far each rank got (its batches, its hook's place in Lightning's order, the epoch-end sync last, the line
within one function), which of a rank's extra calls, which key and whose line, and how many ranks the line lists.

Each case is a pair of programs that differ in one respect of the rule; the expected first lines are written out.
"""

from __future__ import annotations

import dataclasses

from lightning_ext import errors
from lightning_ext._checks.messages import describe_divergence
from lightning_ext._checks.points import Point
from lightning_ext._watch.facts import Call, Facts
from lightning_ext._watch.progress import Progress

BARRIER = "strategy.barrier()"
BROADCAST = "strategy.broadcast(src=0)"


def call_at(rank: int, call: str, site: str | None, hook: str | None, batches: int = 4, stage: str = "train") -> Point:
    """A rank at a checked collective call of the user's code (``site``), in ``hook``."""
    facts = Facts(rank, batches=batches, progress=Progress(stage, 0, hook=hook))
    where = f"{call} at {site}"
    return Point("collective", ("call", call, site), where, call=call, site=site, facts=facts)


def round_at(rank: int, entries: list[dict[str, object]], stage: str = "validate", batches: int = 4) -> Point:
    """A rank at an epoch-end sync round with ``entries`` to sync."""
    names = tuple(str(entry["name"]) for entry in entries)
    facts = Facts(rank, batches=batches, progress=Progress(stage, 0))
    return Point("epoch_logs", ("epoch_logs", names), f"the epoch-end sync of {names}", entries, facts=facts)


def key(name: str, site: str = "/p/m.py:18 in on_validation_epoch_end") -> dict[str, object]:
    fx = site.rsplit(" in ", 1)[1]
    call = f"self.log({name!r}, sync_dist=True)"
    return {"name": name, "fx": fx, "dataloader": None, "reduce": "mean", "site": site, "call": call}


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


# ---- how far each rank got: the hook's place in Lightning's order ----------------------------------------------------
def test_of_two_calls_in_one_batch_the_one_in_the_earlier_hook_is_named() -> None:
    """Rank 0 went past training_step (where rank 1 broadcasts) to a barrier in on_train_batch_end."""
    error = describe_divergence(
        [
            call_at(0, BARRIER, "/p/m.py:50 in on_train_batch_end", "on_train_batch_end"),
            call_at(1, BROADCAST, "/p/m.py:20 in training_step", "training_step"),
        ]
    )
    assert isinstance(error, errors.DivergentCollectiveError)
    assert first_line(error) == (
        "strategy.broadcast(src=0) in training_step (m.py:20) ran on rank 1 only; rank 0 went on."
        " Fix: call it on every rank."
    )


def test_the_hook_order_decides_only_when_every_rank_s_hook_is_known() -> None:
    """Rank 0 is between hooks (no hook known): which call came first is unknown, so both are named."""
    error = describe_divergence(
        [
            call_at(0, BARRIER, "/p/callbacks.py:70 in on_save", None),
            call_at(1, BROADCAST, "/p/m.py:20 in training_step", "training_step"),
        ]
    )
    assert isinstance(error, errors.DivergentCollectiveError)
    assert first_line(error) == (
        "The ranks made different collective calls: rank 0 strategy.barrier() (callbacks.py:70); rank 1"
        " strategy.broadcast(src=0) (m.py:20). Fix: make the same collective calls on every rank."
    )


def test_the_epoch_end_sync_comes_after_every_epoch_end_hook() -> None:
    """Rank 1 barriers in on_test_epoch_end (the last hook of the order); rank 0 skipped it and reached the epoch-end
    sync of its logged keys."""
    site = "/p/m.py:33 in on_test_epoch_end"
    error = describe_divergence(
        [round_at(0, [key("acc", site)], stage="test"), call_at(1, BARRIER, site, "on_test_epoch_end", stage="test")]
    )
    assert isinstance(error, errors.DivergentCollectiveError)
    assert first_line(error) == (
        "strategy.barrier() in on_test_epoch_end (m.py:33) ran on rank 1 only; rank 0 went on."
        " Fix: call it on every rank."
    )


# ---- the line, within one function only ------------------------------------------------------------------------------
def test_within_one_function_the_lower_line_is_named() -> None:
    error = describe_divergence(
        [
            call_at(0, BARRIER, "/p/m.py:30 in validation_step", "validation_step"),
            call_at(1, BROADCAST, "/p/m.py:25 in validation_step", "validation_step"),
        ]
    )
    assert first_line(error) == (
        "strategy.broadcast(src=0) in validation_step (m.py:25) ran on rank 1 only; rank 0 went on."
        " Fix: call it on every rank."
    )


def test_lines_of_two_functions_of_one_file_are_not_compared() -> None:
    """Line 25 of a helper says nothing about whether it runs before line 30 of validation_step."""
    error = describe_divergence(
        [
            call_at(0, BARRIER, "/p/m.py:30 in validation_step", "validation_step"),
            call_at(1, BROADCAST, "/p/m.py:25 in _share", "validation_step"),
        ]
    )
    assert first_line(error) == (
        "The ranks made different collective calls: rank 0 strategy.barrier() (m.py:30); rank 1"
        " strategy.broadcast(src=0) (m.py:25). Fix: make the same collective calls on every rank."
    )


# ---- which of a rank's calls: the first beyond the other ranks' count ------------------------------------------------
def _extra_calls(common: Call, *extra: Call) -> list[Point]:
    """Both ranks at the same check; rank 1 made ``extra`` calls beyond ``common``, the last call both made."""
    point = Point("collective", ("barrier", "x"), "the barrier", call=BARRIER, site="/p/m.py:90 in validation_step")
    facts = [
        Facts(0, counts={"world": common.index}, recent=(common,)),
        Facts(1, counts={"world": extra[-1].index}, recent=(common, *extra)),
    ]
    return [dataclasses.replace(point, facts=facts[rank]) for rank in range(2)]


def test_the_calls_every_rank_made_are_not_extra_and_a_rank_s_first_extra_call_is_named() -> None:
    common = Call("world", 7, "torch.distributed.all_reduce", "/p/m.py:3 in validation_step")
    first = Call("world", 8, "torch.distributed.broadcast", "/p/handler.py:5 in on_term")
    second = Call("world", 9, "torch.distributed.all_gather", "/p/handler.py:9 in on_term")
    error = describe_divergence(_extra_calls(common, first, second))
    assert isinstance(error, errors.DivergentCollectiveError)
    assert first_line(error) == (
        "torch.distributed.broadcast (handler.py:5) ran on rank 1 only; rank 0 went on. Fix: call it on every rank."
    )


# ---- which key, and whose line ---------------------------------------------------------------------------------------
def test_of_the_keys_one_rank_alone_syncs_the_first_logged_is_named() -> None:
    barrier = call_at(1, "strategy.barrier('train_dataloader()')", None, None)  # Lightning's own, on rank 1
    error = describe_divergence([round_at(0, [key("first"), key("second")]), barrier])
    assert isinstance(error, errors.DivergentLoggingError)
    assert first_line(error) == (
        "self.log('first', sync_dist=True) (and 1 more key(s)) in on_validation_epoch_end (m.py:18) synced on rank 0"
        " only; rank 1 went on. Fix: log it on every rank, or with rank_zero_only=True."
    )


def test_keys_that_differ_by_rank_name_each_rank_s_first_key_and_the_lowest_rank_s_line() -> None:
    error = describe_divergence(
        [
            round_at(0, [key("a_first", "/p/a.py:10 in on_validation_epoch_end"), key("a_second", "/p/a.py:11 in x")]),
            round_at(1, [key("b_first", "/p/b.py:20 in on_validation_epoch_end")]),
        ]
    )
    assert isinstance(error, errors.DivergentLoggingError)
    assert first_line(error) == (
        "Synced logging differs between ranks in on_validation_epoch_end (a.py:10): rank 0 syncs 'a_first', rank 1"
        " syncs 'b_first'. Fix: log the same keys on every rank."
    )


def test_keys_every_rank_syncs_in_another_order_are_an_order_difference() -> None:
    """Both keys are synced on both ranks of the world: nothing is synced on some ranks only."""
    first, second = key("first"), key("second", "/p/m.py:19 in on_validation_epoch_end")
    error = describe_divergence([round_at(0, [first, second]), round_at(1, [second, first])])
    assert isinstance(error, errors.DivergentLoggingError)
    assert first_line(error) == (
        "Synced logging differs between ranks: the same keys are synced in a different order in"
        " on_validation_epoch_end (m.py:18). Fix: log the same keys on every rank."
    )


# ---- how many ranks and calls a first line lists ---------------------------------------------------------------------
def test_a_call_on_many_scattered_ranks_lists_three_runs_then_a_count() -> None:
    points = [
        call_at(rank, BARRIER, "/p/m.py:20 in training_step", "training_step")
        if rank % 2 == 0
        else call_at(rank, "strategy.barrier('train_dataloader()')", None, None)
        for rank in range(10)
    ]
    assert first_line(describe_divergence(points)) == (
        "strategy.barrier() in training_step (m.py:20) ran on ranks 0, 2, 4 and 2 more only; the other 5 went on."
        " Fix: call it on every rank."
    )


def test_four_different_calls_name_two_and_count_the_rest() -> None:
    points = [
        call_at(rank, f"strategy.broadcast({rank})", f"/p/f{rank}.py:{rank + 1} in training_step", "training_step")
        for rank in range(4)
    ]
    assert first_line(describe_divergence(points)) == (
        "The ranks made different collective calls: rank 0 strategy.broadcast(0) (f0.py:1); rank 1"
        " strategy.broadcast(1) (f1.py:2) and 2 more. Fix: make the same collective calls on every rank."
    )
