"""What the hang checks' errors say first, in one process: the culprit from the facts, and a first line that stays short
at any world size (1,024 ranks here; 8 in a launched job, tests/checks/test_pitfall_matrix.py).

Points and facts are written by hand, as the ranks would report them; the expected first lines are written out here.
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_ext import errors
from lightning_ext._checks.messages import describe_deadlock, describe_divergence
from lightning_ext._checks.points import Point
from lightning_ext._rank_lists import ranks_text
from lightning_ext._watch.progress import Progress
from lightning_ext._watch.rank_facts import Call, Facts
from lightning_ext._watch.rank_text import grouped_lines

LIMIT = 200  # characters of a first line, at any world size
SCRIPT = "/home/user/project/train.py"
BARRIER = "strategy.barrier('train_dataloader()') via _FitLoop.setup_data, in Trainer.fit called from train.py:61"


def entry(name: str, fx: str = "on_validation_epoch_end", line: int = 18, reduce: str = "mean") -> dict[str, object]:
    call = f"self.log({name!r}, sync_dist=True)" if reduce != "metric" else f"self.log({name!r}, <metric>)"
    site = f"{SCRIPT}:{line} in {fx}"
    return {"name": name, "fx": fx, "dataloader": None, "reduce": reduce, "site": site, "call": call}


def epoch_round(rank: int, entries: list[dict[str, object]], batches: int = 2, stage: str = "sanity_check") -> Point:
    """A rank at an epoch-end sync round (it has keys to sync there)."""
    names = ", ".join(repr(e["name"]) for e in entries)
    facts = Facts(rank, batches=batches, progress=Progress(stage, 0))
    return Point("epoch_logs", ("epoch_logs", names), f"the epoch-end sync of {names}", entries, facts=facts)


def barrier(rank: int, batches: int = 2) -> Point:
    """A rank at Lightning's own barrier before the training dataloader (every rank makes it)."""
    facts = Facts(rank, batches=batches, progress=Progress("train", 0))
    return Point("collective", ("barrier", "train_dataloader()"), BARRIER, call=BARRIER.split(" via")[0], facts=facts)


def step_log(rank: int, name: str, batches: int = 5, line: int = 30) -> Point:
    """A rank at a step value's sync in training_step."""
    detail = entry(name, "training_step", line)
    facts = Facts(rank, batches=batches, progress=Progress("train", 0, hook="training_step"))
    where = f"{detail['call']} (step value) in training_step, {detail['site']}"
    return Point("log", ("log", name), where, detail, call=str(detail["call"]), site=str(detail["site"]), facts=facts)


def lines(error: BaseException) -> list[str]:
    return str(error).splitlines()


# ---- ranks and groups ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([0], "rank 0"),
        (range(1, 8), "ranks 1-7"),
        ([0, 2], "ranks 0 and 2"),
        ([0, 1, 2, 5, 9, 10], "ranks 0-2, 5, 9 and 10"),
        ([0, 1, 5], "ranks 0, 1 and 5"),
        (range(1, 1024), "ranks 1-1023"),
        (range(1, 1024, 2), "ranks 1, 3, 5, 7 and 508 more"),
    ],
)
def test_ranks_are_named_as_ranges_and_counts(ranks: list[int], text: str) -> None:
    assert ranks_text(ranks) == text


@given(st.sets(st.integers(0, 300), min_size=1), st.integers(0, 300))
def test_a_list_of_ranks_reads_one_way_only_when_a_count_follows(ranks: set[int], count: int) -> None:
    """Read back by the grammar people read it with (items split at ", " and at the one " and " before the last), a
    list of ranks followed by another count gives exactly the ranks: the count is never read as one more rank."""
    sentence = f"{count + 1} batches on {ranks_text(ranks, None)} but {count} on rank {count}"
    listed = sentence.split(" on ", 1)[1].split(" but ", 1)[0].removeprefix("ranks ").removeprefix("rank ")
    *items, last = listed.split(" and ") if " and " in listed else ["", listed]
    read: set[int] = set()
    for item in [*(items[0].split(", ") if items and items[0] else []), last]:
        first, _, end = item.partition("-")
        read |= set(range(int(first), int(end or first) + 1))
    assert read == ranks, sentence


def test_detail_lines_group_ranks_doing_the_same_thing_and_stop_at_eight_groups() -> None:
    items = [(rank, "went on" if rank % 100 else f"at key {rank}") for rank in range(1024)]
    grouped = grouped_lines(items)
    assert grouped[:2] == ["  rank 0: at key 0", "  ranks 1-99, 101-199, 201-299, 301-399 and 617 more: went on"]
    assert (
        len(grouped) == 9 and grouped[-1] == "  and 4 more rank(s) (ranks 700, 800, 900 and 1000), elsewhere in 4 ways"
    )


# ---- the founding pitfall: a synced self.log under `if trainer.is_global_zero:` ---------------------------------
@pytest.mark.parametrize("world", [2, 3, 8, 1024])
def test_the_seed_case_names_the_log_its_hook_and_line_and_the_ranks_at_any_world_size(world: int) -> None:
    """Rank 0 syncs 'val_acc' in on_validation_epoch_end during the sanity check; the others went on to Lightning's
    barrier before the training dataloader (the old message blamed that barrier)."""
    points = [epoch_round(0, [entry("val_acc")]), *(barrier(rank) for rank in range(1, world))]
    error = describe_divergence(points)
    assert isinstance(error, errors.DivergentLoggingError)
    others = {2: "rank 1", 3: "ranks 1 and 2"}.get(world, f"ranks 1-{world - 1}")
    assert lines(error)[0] == (
        "self.log('val_acc', sync_dist=True) in on_validation_epoch_end (sanity check, train.py:18) synced on rank 0"
        f" only; {others} went on. Fix: log it on every rank, or with rank_zero_only=True."
    )
    assert len(lines(error)[0]) <= LIMIT
    assert lines(error)[1:3] == [
        "  rank 0: at the epoch-end sync of 'val_acc'",
        f"  {others}: went on to {BARRIER}",
    ]
    assert len(lines(error)) == 4  # the first line, two groups, the fix


def test_a_log_on_every_rank_but_one_names_the_many_that_synced_it() -> None:
    points = [barrier(0), *(epoch_round(rank, [entry("val_acc")]) for rank in range(1, 1024))]
    first = lines(describe_divergence(points))[0]
    assert first.startswith(
        "self.log('val_acc', sync_dist=True) in on_validation_epoch_end (sanity check, train.py:18)"
    )
    assert "synced on ranks 1-1023 only; rank 0 went on. Fix: log it on every rank." in first


def test_keys_that_differ_on_every_one_of_1024_ranks_stay_short() -> None:
    error = describe_divergence([step_log(rank, f"part_{rank}") for rank in range(1024)])
    assert isinstance(error, errors.DivergentLoggingError)
    assert lines(error)[0] == (
        "Synced logging differs between ranks in training_step (train.py:30): rank 0 syncs 'part_0', rank 1 syncs"
        " 'part_1', 1022 more rank(s) other keys. Fix: log the same keys on every rank."
    )
    assert len(lines(error)) == 1 + 9 + 1 + 1  # first line, 8 groups and the rest, the keys' line, the fix
    assert lines(error)[9] == "  and 1016 more rank(s) (ranks 8-1023), elsewhere in 1016 ways"


def test_a_guard_on_every_other_rank_with_long_names_stays_under_the_limit() -> None:
    key = "validation/" + "very_long_metric_name_" * 5
    path = "/" + "deeply/nested/" * 10 + "a_training_script_with_a_long_name_indeed.py"
    detail = {**entry(key), "site": f"{path}:1234 in on_validation_epoch_end"}
    world = 1024
    points = [epoch_round(rank, [detail]) if rank % 2 else barrier(rank) for rank in range(world)]
    first = lines(describe_divergence(points))[0]
    assert len(first) <= LIMIT, first
    assert first == (  # the call and the file's name cut to fit, the rest as it is
        "self.log('validation/very_long_metric_nam... in on_validation_epoch_end (sanity check,"
        " a_training_script_with_a_...:1234) synced on ranks 1, 3, 5 and 509 more only; the other 512 went on."
    )


def test_a_torchmetrics_metric_on_rank_zero_gets_the_metric_advice() -> None:
    points = [epoch_round(0, [entry("val_mean", reduce="metric")], 7, "train"), barrier(1, 7)]
    first = lines(describe_divergence(points))[0]
    assert first == (
        "self.log('val_mean', <metric>) in on_validation_epoch_end (train.py:18) synced on rank 0 only; rank 1 went"
        " on. Fix: update and log the metric on every rank."
    )


def test_a_step_log_behind_another_ranks_step_log_is_the_culprit() -> None:
    """Rank 0 syncs 'val_acc' at its 5th batch; rank 1 passed that batch and syncs 'loss' at its 6th."""
    first = lines(describe_divergence([step_log(0, "val_acc", 5, line=31), step_log(1, "loss", 6)]))[0]
    assert first.startswith("self.log('val_acc', sync_dist=True) in training_step (train.py:31) synced on rank 0 only")


def test_of_two_calls_in_one_batch_and_function_the_earlier_line_is_the_culprit() -> None:
    """``if rank == 0: self.log(...)`` (line 30) before an all_gather every rank makes (line 33): rank 1 passed
    line 30 without the log and is blocked at line 33, where rank 0 has not arrived."""
    call = Call("world", 9, "torch.distributed.all_gather (via LightningModule.all_gather)", f"{SCRIPT}:33 in step")
    blocked = Facts(1, inside=call, batches=5, progress=Progress("train", 0, hook="training_step"))
    point = step_log(0, "val_acc", 5)
    detail = {**point.detail, "site": f"{SCRIPT}:30 in step"}
    point = Point("log", point.identity, point.where, detail, call=point.call, site=str(detail["site"]))
    waiting = Facts(0, check=(3, point.where), counts={"world": 8}, batches=5)
    first = lines(describe_deadlock(point, [waiting], [blocked]))[0]
    assert first.startswith("self.log('val_acc', sync_dist=True) in training_step (train.py:30) synced on rank 0 only")


def test_a_guarded_barrier_after_an_unguarded_step_log_is_the_culprit_not_the_log() -> None:
    """Every rank logs 'loss' (line 30), then rank 0 alone calls ``strategy.barrier()`` (line 34) in training_step:
    rank 1 has finished the hook's body and waits where its step values sync, at the hook's end."""
    site = f"{SCRIPT}:34 in training_step"
    guarded = Point(
        "collective",
        ("barrier", None),
        f"strategy.barrier() called from {site}",
        call="strategy.barrier()",
        site=site,
        facts=Facts(0, batches=5, progress=Progress("train", 0, hook="training_step")),
    )
    detail = entry("loss", "training_step", 30)
    facts = Facts(1, batches=5, progress=Progress("train", 0, hook="training_step"))
    where = f"the step values of training_step ({detail['call']})"
    pack = Point(
        "step_logs",
        ("step_logs", "loss"),
        where,
        [detail],
        call=str(detail["call"]),
        site=str(detail["site"]),
        facts=facts,
    )
    error = describe_divergence([guarded, pack])
    assert isinstance(error, errors.DivergentCollectiveError)
    assert lines(error)[0].startswith("strategy.barrier() in training_step (train.py:34) ran on rank 0 only; rank 1")


# ---- a rank that never arrives, at 1,024 ranks -----------------------------------------------------------------------
def test_a_log_in_training_step_on_rank_zero_at_1024_ranks() -> None:
    point = step_log(0, "val_acc")
    waiting = Facts(0, check=(3, point.where), counts={"world": 8}, backwards=4, batches=5)
    missing = [Facts(rank, backward=5, backwards=4, batches=5) for rank in range(1, 1024)]
    error = describe_deadlock(point, [waiting], missing)
    assert isinstance(error, errors.DivergentLoggingError)
    assert lines(error)[0] == (
        "self.log('val_acc', sync_dist=True) in training_step (train.py:30) synced on rank 0 only; ranks 1-1023 went"
        " on. Fix: log it on every rank, or with rank_zero_only=True."
    )
    assert lines(error)[2] == "  ranks 1-1023: in DDP's gradient all-reduce (synced backward pass #5)"


# ---- uneven data -----------------------------------------------------------------------------------------------------
def test_sized_loaders_with_1024_different_counts_stay_short() -> None:
    points = [
        Point(
            "loaders",
            ("loaders", rank),
            f"the start of training epoch 0 (train dataloader: {10 + rank})",
            {"stage": "training epoch 0", "names": ["train dataloader"], "counts": [10 + rank]},
        )
        for rank in range(1024)
    ]
    error = describe_divergence(points)
    assert isinstance(error, errors.UnevenBatchesError)
    assert lines(error)[0] == (
        "Uneven data in training epoch 0: the train dataloader has 10 batches on rank 0 but 11 on rank 1, and other"
        " counts on 1022 more ranks. Fix: as many batches on every rank, or uneven_batches='truncate'."
    )
    assert len(lines(error)) == 1 + 9 + 1


def test_a_stream_ended_early_on_some_of_1024_ranks_names_them_not_those_behind_in_time() -> None:
    def progress(rank: int) -> Progress:
        if rank % 3 == 0:
            return Progress("validate", 0, train_batches=5, train_done=True)
        if rank % 3 == 1:
            return Progress("train", 0, train_batches=4)  # behind in time, its 5th batch fetched already
        return Progress("validate", 0, train_batches=4, train_done=True)  # one batch short

    point = step_log(0, "loss")
    points = [
        Point(point.kind, point.identity, point.where, point.detail, facts=Facts(r, progress=progress(r)))
        for r in range(1024)
    ]
    first = lines(describe_divergence(points))[0]
    assert first.startswith(
        "Uneven data in epoch 0: the train dataloader ran out after 4 batch(es) on ranks 2, 5, 8 and 338 more but"
        " after 5 on ranks 0, 3, 6 and 339 more."
    )
    assert len(first) <= LIMIT


def test_a_signal_on_every_one_of_1024_ranks_stays_short() -> None:
    facts = [Facts(rank, signal="SIGTERM in training of epoch 0 (4 training batch(es) so far)") for rank in range(1024)]
    error = describe_deadlock(step_log(0, "loss"), facts[:1], facts[1:])
    assert isinstance(error, errors.RankSignalledError)
    assert lines(error)[0] == (
        "Rank 0 received SIGTERM in training of epoch 0 (4 training batch(es) so far), and ranks 1-1023 a signal too:"
        " the job would hang."
    )
    assert len(lines(error)[0]) <= LIMIT


# ---- any world size, any split of the ranks, any names ---------------------------------------------------------------
_SITE = re.compile(r"\(sanity check, (?P<file>[^:]+):(?P<line>\d+)\)")


@given(
    world=st.integers(2, 1024),
    data=st.data(),
    key=st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=120),
    folder=st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=200),
    line=st.integers(1, 10**6),
)
def test_property_the_first_line_names_the_culprit_and_stays_short(
    world: int, data: st.DataObject, key: str, folder: str, line: int
) -> None:
    syncing = data.draw(st.sets(st.integers(0, world - 1), min_size=1, max_size=world - 1))
    detail = {**entry(key), "site": f"/{folder}/{folder[:50]}.py:{line} in on_validation_epoch_end"}
    points = [epoch_round(rank, [detail]) if rank in syncing else barrier(rank) for rank in range(world)]
    error = describe_divergence(points)
    first = lines(error)[0]
    assert isinstance(error, errors.DivergentLoggingError)
    assert len(first) <= LIMIT, first
    assert first.startswith("self.log('" + key[:20])  # the culprit comes first: never Lightning's barrier
    assert "barrier" not in first and "Trainer.fit" not in first
    found = _SITE.search(first)
    assert found is not None and found["line"] == str(line), first
    assert len(lines(error)) <= 1 + 9 + 1


# ---- whose call: the user's, or Lightning's own flow -----------------------------------------------------------------
def test_a_call_that_lightning_makes_with_no_user_frame_on_the_stack_is_lightnings_own() -> None:
    """Under the spawn launcher a rank's stack starts in Lightning, not at the user's ``trainer.fit`` line: here a
    thread whose first frame is a function compiled as Lightning's own file (the stdlib's threading below it)."""
    import lightning.pytorch.trainer.trainer as lightning_trainer

    from lightning_ext._watch.sites import called_as

    namespace: dict[str, Any] = {}
    code = "def _run(out):\n    out.append(called_as(sys._getframe()))\n"
    exec(compile(code, lightning_trainer.__file__, "exec"), {"sys": sys, "called_as": called_as}, namespace)
    found: list[Any] = []
    thread = threading.Thread(target=namespace["_run"], args=(found,))
    thread.start()
    thread.join()
    assert found[0] == ("_run", "an unknown place", True)


def test_a_users_broadcast_does_not_pass_as_the_broadcast_lightning_makes_on_the_other_ranks() -> None:
    """Lightning 2.5's ModelCheckpoint broadcasts on every rank in each validation: a rank-guarded broadcast of the
    user's on rank 0 met it at the check and passed, mixing up the two values (found by the pitfall matrix)."""
    from lightning_ext._checks.points import collective_point
    from lightning_ext._watch.sites import Caller

    users = collective_point("strategy.broadcast(src=0)", ("broadcast", 0), Caller(None, "m.py:4 in f", False))
    lightnings = Caller("ModelCheckpoint.file_exists, in Trainer.fit", "train.py:9 in <module>", True)
    flows = collective_point("strategy.broadcast(src=0)", ("broadcast", 0), lightnings)
    assert users.fingerprint != flows.fingerprint
    assert (users.call, users.site) == ("strategy.broadcast(src=0)", "m.py:4 in f")
    assert flows.site is None  # Lightning's own flow: never a culprit
