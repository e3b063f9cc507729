"""How long each part of a first line may be, and how many ranks and calls it names, in one process: the call and the
file name cut to fit (70 and 40 characters, then 44 and 28, then 30 and 18), the calls some ranks made named for two
ranks, a deadlock's ranks and call, and the dtypes of values that differ by rank.

The expected texts are built here from those widths, never by the messages' own functions.
"""

from __future__ import annotations

from lightning_ext import errors
from lightning_ext._checks.messages import describe_deadlock, describe_divergence
from lightning_ext._checks.messages import first_line as first_line_of
from lightning_ext._checks.points import Point
from lightning_ext._watch.facts import Call, Facts
from lightning_ext._watch.progress import Progress

LIMIT = 200  # characters of a first line


def cut(text: str, longest: int) -> str:
    """``text`` cut to ``longest`` characters, the last three an ellipsis."""
    return text if len(text) <= longest else text[: longest - 3] + "..."


def call_at(rank: int, call: str, site: str | None, hook: str = "training_step", stage: str = "train") -> Point:
    facts = Facts(rank, batches=4, progress=Progress(stage, 0, hook=hook))
    return Point("collective", ("call", call, site), f"{call} at {site}", call=call, site=site, facts=facts)


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


# ---- the call and the file, cut to fit ------------------------------------------------------------------------------
def test_a_long_call_and_file_name_are_cut_to_70_and_40_characters() -> None:
    call = "torch.distributed.all_gather (via " + "LightningModule.all_gather, " * 3 + ")"
    name = "a_very_long_module_name_" * 3 + ".py"
    lightnings = call_at(0, "strategy.barrier('train_dataloader()')", None, hook="on_train_start")
    error = describe_divergence([lightnings, call_at(1, call, f"/p/{name}:12 in training_step")])
    assert isinstance(error, errors.DivergentCollectiveError)
    head = f"{cut(call, 70)} in training_step ({cut(name, 40)}:12) ran on rank 1 only; rank 0 went on."
    assert len(head + " Fix: call it on every rank.") <= LIMIT  # the first widths fit
    assert first_line(error) == head + " Fix: call it on every rank."


def test_where_the_first_widths_do_not_fit_the_call_and_file_are_cut_to_44_and_28_then_30_and_18() -> None:
    call = "torch.distributed.all_gather (via " + "LightningModule.all_gather, " * 3 + ")"
    name = "a_very_long_module_name_" * 3 + ".py"
    world = 1024
    scattered = {rank for rank in range(world) if rank % 3 == 0}  # 342 runs of one rank: named by a count
    points = [
        call_at(rank, call, f"/p/{name}:123456789 in training_step", stage="sanity_check")
        if rank in scattered
        else call_at(rank, "strategy.barrier('train_dataloader()')", None, hook="on_train_start")
        for rank in range(world)
    ]
    first = first_line(describe_divergence(points))

    def head(width: int, file: int) -> str:
        return (
            f"{cut(call, width)} in training_step (sanity check, {cut(name, file)}:123456789) ran on ranks 0, 3, 6"
            f" and 339 more only; the other {world - len(scattered)} went on."
        )

    assert len(head(70, 40)) > LIMIT and len(head(44, 28)) <= LIMIT
    assert first == head(44, 28)  # the advice no longer fits: the cause alone
    # a longer hook and line number: the second widths do not fit either
    line, hook = "12345678901234567890", "on_validation_batch_start"
    points = [
        call_at(rank, call, f"/p/{name}:{line} in {hook}", hook=hook, stage="sanity_check")
        if rank in scattered
        else call_at(rank, "strategy.barrier('train_dataloader()')", None, hook="on_train_start")
        for rank in range(world)
    ]
    first = first_line(describe_divergence(points))

    def longer(width: int, file: int) -> str:
        return (
            f"{cut(call, width)} in {hook} (sanity check, {cut(name, file)}:{line}) ran on ranks 0, 3, 6 and 339 more"
            f" only; the other {world - len(scattered)} went on."
        )

    assert len(longer(44, 28)) > LIMIT and len(longer(30, 18)) <= LIMIT
    assert first == longer(30, 18)


# ---- calls some ranks made that no rule can blame: two ranks named ---------------------------------------------------
def test_extra_calls_of_lightning_s_own_name_two_ranks_cut_to_150_characters() -> None:
    """Ranks 1-3 each made a call of Lightning's own beyond rank 0's count (no user's line: no culprit)."""
    site = "/home/user/" + "deeply/nested/" * 6 + "train.py:9 in <module>"
    calls = {rank: Call("world", 8, f"torch.distributed.broadcast #{rank}", site, lightning=True) for rank in (1, 2, 3)}
    point = Point("collective", ("barrier", "x"), "the barrier", call="strategy.barrier()")
    points = [Point(**{**vars(point), "facts": Facts(0, counts={"world": 7})})]
    points += [Point(**{**vars(point), "facts": Facts(r, counts={"world": 8}, recent=(calls[r],))}) for r in calls]
    error = describe_divergence(points)
    assert isinstance(error, errors.DivergentCollectiveError)
    named = "; ".join(f"rank {rank}: {calls[rank].name} called from {site}" for rank in (1, 2))
    assert len(named) > 150
    assert first_line(error) == f"A collective call made on some ranks only ({cut(named, 150)})."


# ---- a deadlock no rule can blame: who waited, at what, who can never come ----------------------------------------
def _deadlock(waiting: list[int], missing: list[int], call: str) -> str:
    point = Point("collective", ("end",), "the end of training", call=call)
    facts = {rank: Facts(rank, check=(3, point.where), checks=2, batches=4) for rank in waiting}
    facts |= {rank: Facts(rank, checks=2, batches=4, backward=5, backwards=4) for rank in missing}
    error = describe_deadlock(point, [facts[r] for r in waiting], [facts[r] for r in missing])
    assert isinstance(error, errors.DivergentCollectiveError)
    return first_line(error)


def test_a_deadlock_names_three_runs_of_ranks_on_each_side() -> None:
    assert _deadlock([0, 2, 4, 6], [1, 3, 5, 7], "x") == (
        "ranks 0, 2, 4 and 1 more waited at x, which ranks 1, 3, 5 and 1 more can never reach: the job would hang"
        " until the process-group timeout."
    )


def test_a_deadlock_cuts_the_call_it_waited_at_to_80_characters() -> None:
    call = "strategy.barrier('" + "the end of a very long named stage, " * 4 + "')"
    assert _deadlock([0], [1], call) == (
        f"rank 0 waited at {cut(call, 80)}, which rank 1 can never reach: the job would hang until the process-group"
        " timeout."
    )


# ---- values of another dtype by rank --------------------------------------------------------------------------------
def test_values_of_another_dtype_list_each_rank_s_layout_and_cut_the_keys_to_60_characters() -> None:
    names = [f"a_long_metric_name_{index}" for index in range(4)]
    entries = [
        {"name": name, "fx": "training_step", "dataloader": None, "reduce": "mean",
         "site": "/p/m.py:7 in training_step", "call": f"self.log({name!r}, sync_dist=True)"}
        for name in names
    ]  # fmt: skip
    keys = tuple(("training_step", name, None, "mean") for name in names)
    # each pack: (op, dtype, size, device), as the coalesced sync packs them
    layouts = {
        0: (("mean", "float32", 4, "cpu"),),
        1: (("mean", "float64", 4, "cpu"),),
        2: (("mean", "float32", 4, "cuda"),),
    }

    def at(rank: int) -> Point:
        facts = Facts(rank, batches=4, progress=Progress("train", 0, hook="training_step"))
        identity = ("step_logs", keys, layouts[rank])
        where = "the step sync"
        return Point("step_logs", identity, where, entries, call=str(entries[0]["call"]), site=str(entries[0]["site"]),
                     facts=facts)  # fmt: skip

    error = describe_divergence([at(rank) for rank in range(3)])
    assert isinstance(error, errors.DivergentLoggingError)
    listed = cut(", ".join(repr(name) for name in names), 60)
    assert str(error).splitlines() == [
        f"The synced values of {listed} in training_step (m.py:7) differ in dtype or device by rank."
        " Fix: the same dtype and device on every rank.",
        "  rank 0: values 4 float32 (mean)",
        "  rank 1: values 4 float64 (mean)",
        "  rank 2: values 4 float32 on cuda (mean)",
    ]


# ---- the keys some ranks synced, and the file of an order difference --------------------------------------------
def _round(rank: int, names: list[str], site: str) -> Point:
    entries = [
        {"name": name, "fx": "on_validation_epoch_end", "dataloader": None, "reduce": "mean", "site": site,
         "call": f"self.log({name!r}, sync_dist=True)"}
        for name in names
    ]  # fmt: skip
    facts = Facts(rank, batches=4, progress=Progress("validate", 0))
    return Point("epoch_logs", ("epoch_logs", tuple(names)), "the epoch-end sync", entries, facts=facts)


def test_the_keys_some_ranks_synced_are_listed_eight_then_counted_with_the_file_cut_to_40() -> None:
    names = [f"k{index}" for index in range(10)]
    module = "a_very_long_module_name_" * 3 + ".py"
    lightnings = call_at(1, "strategy.barrier('train_dataloader()')", None, hook="on_train_start")
    error = describe_divergence([_round(0, names, f"/p/{module}:18 in on_validation_epoch_end"), lightnings])
    listed = ", ".join(f"{name!r} (on_validation_epoch_end, {cut(module, 40)}:18: rank 0)" for name in names[:8])
    assert f"  synced on some ranks only: {listed} and 2 more" in str(error).splitlines()


def test_a_first_line_keeps_its_advice_up_to_200_characters() -> None:
    advice = "Fix: call it on every rank."
    exactly = "c" * (LIMIT - 1 - len(advice))
    assert first_line_of(exactly, advice) == f"{exactly} {advice}"  # 200 characters: both
    assert first_line_of(exactly + "c", advice) == exactly + "c"  # 201: the cause alone
    assert first_line_of("c" * (LIMIT + 1), advice) == "c" * (LIMIT - 3) + "..."  # the cause cut to 200


def test_an_order_difference_cuts_the_file_name_to_40_characters() -> None:
    name = "a_very_long_module_name_" * 3 + ".py"
    site = f"/p/{name}:18 in on_validation_epoch_end"
    error = describe_divergence([_round(0, ["a", "b"], site), _round(1, ["b", "a"], site)])
    assert isinstance(error, errors.DivergentLoggingError)
    assert first_line(error) == (
        "Synced logging differs between ranks: the same keys are synced in a different order in"
        f" on_validation_epoch_end ({cut(name, 40)}:18). Fix: log the same keys on every rank."
    )


def test_a_deadlock_no_rule_can_blame_gives_the_fix_of_its_kind() -> None:
    """At a collective, the collectives' fix; at a synced log, the logging fix (the message's last line)."""
    collective = Point("collective", ("end",), "the end of training", call="x")
    logged = Point("epoch_logs", ("epoch_logs", ()), "the epoch-end sync of nothing", [], call="y")
    waiting, missing = Facts(0, check=(3, "x"), checks=2), Facts(1, checks=2, backward=5, backwards=4)
    at_collective = describe_deadlock(collective, [waiting], [missing])
    at_log = describe_deadlock(logged, [waiting], [missing])
    assert isinstance(at_collective, errors.DivergentCollectiveError)
    assert str(at_collective).splitlines()[-1].startswith("`trainer.log_dir`, `trainer.save_checkpoint(...)`")
    assert isinstance(at_log, errors.DivergentLoggingError)
    assert first_line(at_log).startswith("rank 0 waited at y, which rank 1 can never reach")
    assert str(at_log).splitlines()[-1].startswith("Every rank must make the same synced logging calls")
