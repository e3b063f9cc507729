"""The hang checks in real gloo process groups (the persistent rank pools): random scripts, truncation, streams.

The expected outcome of every script is worked out here from the script alone, without lightning_ext: uneven batch
counts end in ``UnevenBatchesError`` naming the loader and each rank's count; synced logging that some ranks skip
ends in ``DivergentLoggingError`` naming the first skipped key(s) and exactly which ranks did and did not sync them;
a script without divergence produces the same files, steps and metrics as the same run under stock ``DDPStrategy``.
"""

from __future__ import annotations

import math
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_ext._torch_collectives import COLLECTIVES
from tests.helpers import hang_tasks, search
from tests.helpers.hang_tasks import HOOKS

WORLDS = (1, 2, 3, 4)


def run(rank_pools: Any, world: int, log_dir: Path, script: dict[str, Any], **options: Any) -> list[dict[str, Any]]:
    """Every rank's outcome, each with the run's files (read once every rank has finished and closed its own)."""
    pool = rank_pools(world)
    outcomes: list[dict[str, Any]] = pool.run("tests.helpers.hang_tasks:fit", (str(log_dir), script, options, world))
    run_dir = log_dir / "run"
    files = {path.relative_to(run_dir).as_posix(): path.read_text() for path in sorted(run_dir.rglob("*.csv"))}
    return [{**outcome, "files": files} for outcome in outcomes]


# ---- the expected outcome, from the script alone --------------------------------------------------------------------
def first_divergence(script: dict[str, Any], world: int) -> tuple[str, list[str], list[int]] | None:
    """``(error class, the culprit keys or loader, the ranks that have it)``, or ``None`` if nothing diverges."""
    for stage in ("train", "val"):  # training epoch 0 compares the train loader first, its validation run next
        counts = script[f"{stage}_batches"]
        if len(set(map(str, counts))) > 1:
            return "UnevenBatchesError", [f"{stage} dataloader"], []
    logs = [entry for entry in script["logs"] if entry["skipped_by"] and len(entry["skipped_by"]) < world]
    if world == 1 or not logs:
        return None
    ranks = lambda entry: [rank for rank in range(world) if rank not in entry["skipped_by"]]  # noqa: E731
    step_values = [e for e in logs if e["hook"] == "validation_step" and e["phase"] == "step"]
    if step_values:  # synced at every validation batch, in the order logged: the first skipped one is met first
        return "DivergentLoggingError", [step_values[0]["name"]], ranks(step_values[0])
    # Lightning syncs the validation_step epoch values when the loader is done (_store_dataloader_outputs), before
    # on_validation_epoch_end, whose values sync in a round of their own; training syncs its epoch values once
    rounds = (("validation_step",), ("on_validation_epoch_end",), ("training_step", "on_train_epoch_end"))
    for round_hooks in rounds:
        skipped = [entry for entry in logs if entry["hook"] in round_hooks]  # the first epoch-end round that differs
        if skipped:
            return "DivergentLoggingError", [entry["name"] for entry in skipped], ranks(skipped[0])
    return None


@st.composite
def scripts(draw: st.DrawFn, world: int) -> dict[str, Any]:
    """A logging script; some ranks may skip some synced keys (one group of ranks), or run other batch counts."""
    even = draw(st.booleans()) or world == 1
    train = [3] * world if even else draw(st.lists(st.integers(2, 4), min_size=world, max_size=world))
    val = [2] * world if even else draw(st.lists(st.integers(1, 3), min_size=world, max_size=world))
    skippers = draw(st.sets(st.integers(0, world - 1), max_size=world - 1)) if world > 1 else set()
    logs = []
    for index in range(draw(st.integers(1, 4))):
        hook = draw(st.sampled_from(HOOKS))
        phase = draw(st.sampled_from(["step", "epoch"])) if hook.endswith("_step") else "epoch"
        # a training_step value synced on some ranks only meets DDP's gradient all-reduce on the others: that
        # deadlock is shown by the launched tests, not in the pool (it would leave the pool's group blocked)
        skippable = (hook, phase) != ("training_step", "step")
        skipped = sorted(skippers) if skippable and draw(st.booleans()) else []
        special = draw(st.none() | st.tuples(st.integers(0, world - 1), st.sampled_from(["nan", "inf", "-inf"])))
        logs.append({"hook": hook, "phase": phase, "name": f"k{index}", "offset": index, "skipped_by": skipped,
                     "special": special})  # fmt: skip
    return {"train_batches": train, "val_batches": val, "logs": logs}


def check_outcome(script: dict[str, Any], world: int, checked: list[dict[str, Any]], reference: Any) -> None:
    expected = first_divergence(script, world)
    if expected is None:
        assert [o["error"] for o in checked] == [None] * world, [o["message"] for o in checked]
        baseline: list[dict[str, Any]] = reference()
        for mine, theirs in zip(checked, baseline):  # as stock DDPStrategy: files, steps, metrics
            # every file stock writes, byte for byte (ours also writes each rank's own file)
            assert {name: mine["files"][name] for name in theirs["files"]} == theirs["files"]
            assert (mine["global_step"], mine["epochs"]) == (theirs["global_step"], theirs["epochs"])
            assert _same(mine["callback_metrics"], theirs["callback_metrics"])
        return
    error, culprits, having = expected
    assert {o["error"] for o in checked} == {error}, [o["message"] for o in checked]
    assert len({o["message"] for o in checked}) == 1, "the ranks raised different messages"
    message = checked[0]["message"]
    first = message.splitlines()[0]
    if error == "UnevenBatchesError":  # the first line names the loader; a line per group of ranks, each one's count
        stage = culprits[0].split()[0]
        assert first.startswith("Uneven data") and culprits[0] in first, message
        named = ranks_in_lines(message)
        for rank, count in enumerate(script[f"{stage}_batches"]):
            assert named[rank].startswith(culprits[0]), message
            assert named[rank].endswith(f": {count} batch{'' if count == 1 else 'es'}"), message
        return
    for name in culprits:
        assert f"{name!r}" in message, message
    # the first line names a key that not every rank syncs, and the ranks that sync it (alone, or beside others'
    # keys when the other ranks sync another key at the same time)
    keys = "|".join(re.escape(repr(name)) for name in culprits)
    having_text = re.escape(ranks_named(having))
    alone = rf"self\.log\(({keys}), sync_dist=True\).* synced on {having_text} only;"
    beside = rf"{having_text} syncs? ({keys})"
    assert re.search(alone, first) or re.search(beside, first), message


def ranks_named(ranks: list[int]) -> str:
    """How the messages name a few ranks: ``rank 2``, ``ranks 0, 1 and 3``, ``ranks 0-2 and 5`` (three or more
    consecutive ranks as a range; "and" before the last)."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [part for run in runs for part in ([f"{run[0]}-{run[-1]}"] if len(run) > 2 else map(str, run))]
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return ("rank " if len(ranks) == 1 else "ranks ") + text


def ranks_in_lines(message: str) -> dict[int, str]:
    """Each rank's detail line (``  ranks 0-1, 3: <text>``), read back: rank -> text."""
    named = {}
    for line in message.splitlines()[1:]:
        found = re.match(r"  ranks? ([0-9, -]+(?: and [0-9-]+)?): (.*)$", line)
        if found is None:
            continue
        for part in found[1].replace(" and ", ", ").split(", "):
            low, _, high = part.partition("-")
            for rank in range(int(low), int(high or low) + 1):
                named[rank] = found[2]
    return named


def _same(mine: dict[str, float], theirs: dict[str, float]) -> bool:
    return mine.keys() == theirs.keys() and all(
        mine[k] == theirs[k] or (math.isnan(mine[k]) and math.isnan(theirs[k])) for k in mine
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [pytest.param(w, marks=pytest.mark.both_packages) if w == 2 else w for w in WORLDS])
def test_property_random_scripts_fail_by_name_or_change_nothing(rank_pools: Any, tmp_path: Path, world: int) -> None:
    examples = search.examples(search.PER_SUITE_FIT)

    @settings(max_examples=examples)
    @given(script=scripts(world))
    def check(script: dict[str, Any]) -> None:
        root = tmp_path / f"example{len(list(tmp_path.iterdir()))}"
        checked = run(rank_pools, world, root / "checked", script)
        check_outcome(script, world, checked, lambda: run(rank_pools, world, root / "stock", script, stock=True))

    check()


# ---- truncation: the same as loaders cut by hand -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "train", "val"),
    [
        pytest.param(2, [5, 3], [2, 4], marks=pytest.mark.both_packages),
        (3, [4, 6, 3], [3, 1, 2]),
        pytest.param(2, [[5], [3]], [2, 2], marks=pytest.mark.both_packages),
    ],
    ids=["two-ranks", "three-ranks", "stream"],
)
def test_truncation_matches_loaders_cut_by_hand(
    rank_pools: Any, tmp_path: Path, world: int, train: Any, val: Any
) -> None:
    logs = [
        {"hook": "training_step", "phase": "step", "name": "loss", "offset": 0, "skipped_by": [], "special": None},
        {"hook": "training_step", "phase": "epoch", "name": "mean", "offset": 1, "skipped_by": [], "special": None},
        {"hook": "validation_step", "phase": "step", "name": "val", "offset": 2, "skipped_by": [], "special": None},
        {"hook": "validation_step", "phase": "epoch", "name": "vm", "offset": 3, "skipped_by": [], "special": None},
    ]  # fmt: skip
    stream = isinstance(train[0], list)
    options: dict[str, Any] = {"uneven_batches": "truncate", "check_unsized_loaders": stream}
    truncated = run(
        rank_pools, world, tmp_path / "truncated", {"train_batches": train, "val_batches": val, "logs": logs}, **options
    )
    shortest = min(count[0] if stream else count for count in train)
    cut = {
        "train_batches": [[shortest]] * world if stream else [shortest] * world,
        "val_batches": [min(val)] * world,
        "logs": logs,
    }
    reference = run(rank_pools, world, tmp_path / "cut", cut, hang_checks=False)
    for mine, theirs in zip(truncated, reference):
        assert mine["error"] is None, mine["message"]
        assert (mine["global_step"], mine["epochs"]) == (theirs["global_step"], theirs["epochs"]) == (2 * shortest, 2)
        assert mine["files"] == theirs["files"]  # every row of metrics.csv and of every rank's own file


@pytest.mark.both_packages
@pytest.mark.slow
def test_stream_that_runs_out_on_one_rank_is_an_error_naming_it(rank_pools: Any, tmp_path: Path) -> None:
    script = {"train_batches": [[3], [5]], "val_batches": [2, 2], "logs": []}
    outcomes = run(rank_pools, 2, tmp_path, script, check_unsized_loaders=True)
    assert {o["error"] for o in outcomes} == {"UnevenBatchesError"}
    assert outcomes[0]["message"].splitlines()[0] == (
        "Uneven data: the train dataloader (no length) ran out after 3 batch(es) on rank 0 while rank 1 had more."
    )


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_a_synced_value_of_another_dtype_on_one_rank_is_an_error_naming_it(
    rank_pools: Any, tmp_path: Path, world: int
) -> None:
    """Rank 1 logs a float64 tensor where the others log a float: the bytes of the values that ride the hook's check
    would not line up, so the check says so (stock's all-reduce of a float32 and a float64 does not sync them)."""
    entry = {"name": "x", "hook": "training_step", "phase": "step", "offset": 0.0, "skipped_by": [], "float64_on": [1]}
    script = {"train_batches": [2] * world, "val_batches": [1] * world, "logs": [entry]}
    outcomes = run(rank_pools, world, tmp_path, script)
    assert {o["error"] for o in outcomes} == {"DivergentLoggingError"}
    assert len({o["message"] for o in outcomes}) == 1
    lines = (Path(hang_tasks.__file__)).read_text().splitlines()
    line = next(number for number, text in enumerate(lines, 1) if text.endswith("# log: here"))
    first, *details = outcomes[0]["message"].splitlines()
    assert first == (
        f"The synced values of 'x' in training_step (hang_tasks.py:{line}) differ in dtype or device by rank."
        " Fix: the same dtype and device on every rank."
    )
    others = {2: "rank 0", 3: "ranks 0 and 2"}.get(world, "ranks 0, 2 and 3")
    assert sorted(details) == sorted(["  rank 1: values 1 float64 (mean)", f"  {others}: values 1 float32 (mean)"])


# ---- the check itself: one verdict, the same on every rank ---------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_property_a_check_agrees_exactly_when_every_rank_brings_the_same(rank_pools: Any, world: int) -> None:
    identity = st.lists(st.sampled_from(["a", "b", 0, 1, -1, 2**61]), min_size=1, max_size=3)

    namespace = f"lockstep-test/{uuid.uuid4().hex}/"
    pool = rank_pools(world)

    @settings(max_examples=search.examples(search.PER_SUITE_CHEAP))
    @given(calls=st.lists(st.lists(identity, min_size=world, max_size=world), min_size=1, max_size=4))
    def check(calls: list[list[list[Any]]]) -> None:
        per_rank = [(namespace, [call[rank] for call in calls]) for rank in range(world)]
        answers = pool.run("tests.helpers.hang_tasks:lockstep_verdicts", *per_rank)
        for position, call in enumerate(calls):
            same = all(tuple(theirs) == tuple(call[0]) for theirs in call)
            verdicts = [answer[position] for answer in answers]
            expected = True if same else [tuple(theirs) for theirs in call]
            assert verdicts == [expected] * world, (call, verdicts)

    try:
        check()
    finally:
        pool.run("tests.helpers.hang_tasks:lockstep_close", (namespace,))


@pytest.mark.slow
def test_a_check_waits_past_the_channels_set_up_limit_as_long_as_a_training_collective(rank_pools: Any) -> None:
    """The pairs connect within ``check_channel_timeout``; a check then waits as a training collective does: a rank
    7 s late to a check whose channel had 5 s to connect (the ranks lined up first) is waited for: gloo's timeout of
    each exchange, not the group's."""
    namespace = f"slow-exchange/{uuid.uuid4().hex}/"
    outcomes = rank_pools(2).run("tests.helpers.hang_tasks:slow_exchange", (namespace, 5.0, 7.0), timeout=120)
    assert [agreed for agreed, _ in outcomes] == [True, True]
    assert outcomes[0][1] > 5.0  # rank 0 did wait for the late rank, past the channel's limit


# ---- set-up: every misconfiguration raises on every rank, after the set-up gather ----------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("per_rank", "fragments"),
    [
        (  # rank 1's Quorum(3) cannot be met at world size 2: it must not raise before rank 0 leaves the gather
            [(1, "quorum:2"), (1, "quorum:3")],
            ("ValueError", "Invalid decision policy: rank 1: checkpoint_policy=Quorum(k=3)", "only 2 rank(s) vote"),
        ),
        (
            [(2, "all"), (1, "all")],
            ("PolicyMismatchError", "different numbers of CSV/TensorBoard loggers (rank 0: 2, rank 1: 1)"),
        ),
    ],
    ids=["quorum-2-and-3", "logger-counts"],
)
@pytest.mark.both_packages
def test_a_misconfigured_rank_fails_set_up_on_every_rank(
    rank_pools: Any, tmp_path: Path, per_rank: list[tuple[int, str]], fragments: tuple[str, ...]
) -> None:
    from lightning_ext import Quorum

    def policy(name: str) -> Any:
        return Quorum(int(name.split(":")[1])) if name.startswith("quorum:") else name

    arguments = [(str(tmp_path), loggers, policy(name), 2) for loggers, name in per_rank]
    outcomes = rank_pools(2).run("tests.helpers.hang_tasks:fit_with_loggers", *arguments)
    assert len({(o["error"], o["message"]) for o in outcomes}) == 1, outcomes
    text = f"{outcomes[0]['error']}: {outcomes[0]['message']}"
    for fragment in fragments:
        assert fragment in text, text


# ---- the facts a rank reports: its collective calls, counted symmetrically -------------------------------------------
@pytest.mark.slow
def test_collective_calls_are_counted_and_reported_while_a_rank_waits_in_one(rank_pools: Any) -> None:
    namespace = f"ledger-test/{uuid.uuid4().hex}/"
    outcomes = rank_pools(2).run("tests.helpers.hang_tasks:ledger", (namespace,))
    for outcome in outcomes:  # the all-reduce and the barrier; not the send/recv, not another thread's all-reduce
        assert outcome["counted"] == {"world": 2}
        assert outcome["after"] == {"world": 3} and outcome["total"] == 3
    assert outcomes[0]["seen"] == {"inside": "torch.distributed.all_reduce", "index": 3}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_each_collective_call_is_counted_once_and_no_point_to_point_call(rank_pools: Any, world: int) -> None:
    """Every symmetric ``torch.distributed`` call counts once, the ``_single`` names torch 2.13 asks for instead of
    ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` among them (a rank-guarded call that was not counted
    could not be named); a send, a receive, an isend or an irecv counts nothing."""
    for outcome in rank_pools(world).run("tests.helpers.hang_tasks:count_each_collective"):
        assert {name: count for name, count in outcome.items() if count != 1} == {"send/recv": 0, "isend/irecv": 0}
        assert set(outcome) - {"send/recv", "isend/irecv"} == set(COLLECTIVES), "a listed call the task does not make"


@pytest.mark.slow
def test_a_second_run_in_a_process_opens_no_new_store_connection(rank_pools: Any, tmp_path: Path) -> None:
    """The store connections that the checks and the stall report open (on first use: a normal run opens only its
    watchdog thread's) serve the next run of the process (opening one costs a reverse lookup of the server's address,
    which a slow resolver holds for seconds)."""
    ports = rank_pools(2).run("tests.helpers.hang_tasks:store_connections_across_fits", (str(tmp_path), 2))
    for after_first, after_second in ports:
        # no connection after the second fit that was not there after the first (some of the first's may close late)
        assert set(after_second) <= set(after_first), ports
        assert len(after_second) >= 2, ports  # the default group's, and the watchdog's, kept for the next run


@pytest.mark.slow
def test_a_check_completed_for_a_failing_run_raises_the_posted_error_before_its_watchdog_reads_it(
    rank_pools: Any,
) -> None:
    """Another rank's watchdog completes a check (its fillers) once an error is posted; a rank whose own watchdog has
    not read the error yet (busy: here, for 20 s) must raise that error at once, not take the check's disagreement
    for a divergence and wait in the divergence's gather for ranks that never come (60 s, then a store timeout).
    Seen at 3 ranks in the pitfall matrix (``all_gather@on_validation_epoch_end``: the last rank's error after 62 s)."""
    namespace = f"filled-check/{uuid.uuid4().hex}/"
    busy = 20.0
    task = "tests.helpers.hang_tasks:check_filled_before_posted_is_read"
    outcomes = rank_pools(3).run(task, (namespace, busy), timeout=180.0)
    assert [outcome["error"] for outcome in outcomes] == ["DivergentCollectiveError"] * 3, outcomes
    assert {outcome["message"] for outcome in outcomes} == {"rank 0 stands for a rank stuck elsewhere"}, outcomes
    # rank 2 raised before its busy watchdog could have told it: it learnt of the error from the store
    assert outcomes[2]["seconds"] < busy, outcomes
