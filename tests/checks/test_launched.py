"""The pitfalls that freeze Lightning DDP jobs, as real launched jobs: ours end with the named error on every rank.

The scenarios of ``tests/helpers/scripts/hang_scenarios.py`` run under Lightning's default launcher (popen) where the
pitfall matrix (tests/checks/test_pitfall_matrix.py) does not already run them, some with ``start_method="spawn"`` and
under torchrun (2 nodes x 1 process, on loopback). With ``PolicyDDPStrategy`` every
rank must end with the same error, naming the culprit and the fix, within 30 s of the first rank reaching the point of
divergence, with its per-rank rows flushed. The same scripts with stock ``DDPStrategy`` are shown hanging (cut by a
timeout) or ending without naming anything. Every job runs in the background, ours two at a time, and each test
checks its own job's outcome.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lightning_ext.demo.pitfalls import run_pitfall
from tests.helpers.jobs import REPO, Job, StaggeredJobs, clean_env, two_node_torchrun

pytestmark = (
    pytest.mark.ci
)  # launched jobs: minutes of start-up CPU on 2 cores, so make test leaves them to CI (make test-ci)

SCRIPT = REPO / "tests" / "helpers" / "scripts" / "hang_scenarios.py"
# Seconds from the first rank reaching the divergence to the last rank's error: so generous that only a hang breaks
# it. A check ends these scenarios in a few seconds on a quiet machine (its first look is after 2 s); a hang lasts until
# the process group's timeout (30 minutes here), and a loaded machine has been seen to take a minute.
LIMIT = 300.0
RUN_TIMEOUT = 600.0  # a job of ours that runs longer than this has hung (start-up and training included, under load)
STOCK_CUTOFF = 25.0  # seconds a stock job must still be hanging after reaching the divergence


def _line_of(code: str) -> str:
    """``hang_scenarios.py:<line>``: where ``code`` stands in the script (the messages must name that line)."""
    lines = SCRIPT.read_text().splitlines()
    return f"hang_scenarios.py:{next(n for n, line in enumerate(lines, 1) if code in line)}"


def _at(code: str, hook: str) -> str:
    """`` in <hook> (hang_scenarios.py:<line>)``: where a first line names the user's call."""
    return f" in {hook} ({_line_of(code)})"


# scenario (``name:variant`` runs the script's ``name``): (strategy options in the script, error on every rank, what
# the first line must say, what the rest of the message must name, rows kept per rank)
EXPECTED: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...], int]] = {
    "uneven_train": (
        "ours",
        "UnevenBatchesError",
        ("Uneven data in training epoch 0: the train dataloader has 4 batches on rank 0 but 6 on rank 1", "truncate"),
        ("  rank 0: train dataloader: 4 batches", "  rank 1: train dataloader: 6 batches"),
        0,
    ),
    "uneven_val": (
        "ours",
        "UnevenBatchesError",
        ("the val dataloader 0 has 2 batches on rank 0 but 4 on rank 1",),
        ("  rank 0: val dataloader 0: 2 batches",),
        0,
    ),
    "uneven_iterable_train": (  # a stream without check_unsized_loaders: found when the ranks cannot meet
        "ours",
        "UnevenBatchesError",
        ("Uneven data in epoch 0: the train dataloader ran out after 4 batch(es) on rank 0 while rank 1 had more",),
        # how far rank 1 got is a matter of time (4 or 5 batches); where rank 0 ran out is not
        (
            "  rank 0: ran out after 4 training batch(es)",
            "training batch(es) so far, and more to come",
            "check_unsized_loaders=True",
        ),
        1,
    ),
    "log_on_rank_zero_epoch_end": (
        "ours",
        "DivergentLoggingError",
        (
            "self.log('val_acc', sync_dist=True)"
            + _at('self.log("val_acc"', "on_validation_epoch_end")
            + " synced on rank 0 only; rank 1 went on. Fix: log it on every rank, or with rank_zero_only=True.",
        ),
        ("rank_zero_only",),
        4,
    ),
    "log_on_rank_zero_step": (
        "ours",
        "DivergentLoggingError",
        (
            "self.log('rank_zero_only_loss', sync_dist=True)"
            + _at('self.log("rank_zero_only_loss"', "training_step")
            + " synced on rank 0 only; rank 1 did not sync it. Fix: log it on every rank, or with rank_zero_only=True.",
        ),
        # the hook's step values sync together when it returns: rank 1 is there with the key every rank logs
        ("  rank 1: at the step sync of 'train_loss' logged in training_step at batch_idx 1 of training epoch 0",),
        1,
    ),
    "log_dict_keys_differ": (
        "ours",
        "DivergentLoggingError",
        (
            "Synced logging differs between ranks"
            + _at("self.log_dict(", "training_step")
            + ": rank 0 syncs 'part_0', rank 1 syncs 'part_1'. Fix: log the same keys on every rank.",
        ),
        (),
        0,
    ),
    "metric_on_some_ranks": (  # the advice that works for a metric object (rank_zero_only=True does not stop its sync)
        "ours",
        "DivergentLoggingError",
        (
            "self.log('val_mean', <metric>)"
            + _at('self.log("val_mean"', "validation_step")
            + " synced on rank 0 only; rank 1 did not sync it. Fix: update and log the metric on every rank.",
        ),
        ("every rank must update and log the metric object",),
        4,
    ),
    "log_dir_on_rank_zero": (
        "ours",
        "DivergentCollectiveError",
        (
            "Trainer.log_dir (strategy.broadcast)"
            + _at("print(self.trainer.log_dir)", "training_step")
            + " ran on rank 0",
        ),
        (),
        1,
    ),
    "save_checkpoint_on_rank_zero": (
        "ours",
        "DivergentCollectiveError",
        (
            "Trainer.save_checkpoint (strategy.barrier)"
            + _at("save_checkpoint(", "on_train_epoch_end")
            + " ran on rank 0",
        ),
        (),
        4,
    ),
    "barrier_on_rank_zero": (
        "ours",
        "DivergentCollectiveError",
        ("strategy.barrier()" + _at("strategy.barrier()", "training_step") + " ran on rank 0 only; rank 1 went on.",),
        (),
        1,
    ),
    "broadcast_on_rank_zero": (
        "ours",
        "DivergentCollectiveError",
        ("strategy.broadcast(src=0)" + _at("strategy.broadcast(batch_idx)", "training_step") + " ran on rank 0",),
        (),
        1,
    ),
    "all_gather_on_rank_zero": (
        "debug",
        "DivergentCollectiveError",
        ("LightningModule.all_gather (strategy.all_gather)" + _at("self.all_gather(loss)", "training_step"),),
        (),
        1,
    ),
    # the other rank's next check is a synced log: the all_gather is still named, with its line, in either mode
    "all_gather_on_rank_zero_in_validation": (
        "ours",
        "DivergentCollectiveError",
        (
            "torch.distributed.all_gather (via LightningModule.all_gather)"
            + _at("self.all_gather(value)", "validation_step")
            + " ran on rank 0 only",
        ),
        (),
        4,
    ),
    "all_gather_on_rank_zero_in_validation:debug": (
        "debug",
        "DivergentCollectiveError",
        ("LightningModule.all_gather (strategy.all_gather)" + _at("self.all_gather(value)", "validation_step"),),
        (),
        4,
    ),
    "sigterm_on_one_rank": (  # as a preemption notice to one rank: Lightning's handler would hang the job
        "no_stop",  # without the coordinated stop (preemption_policy=None)
        "RankSignalledError",
        ("Rank 1 received SIGTERM in training of epoch 0",),
        ("send it to every rank",),
        2,
    ),
}
FAILING_RANK = "rank_raises"  # rank 1 raises ValueError; rank 0 must end with its error and traceback


def run_scenario(scenario: str, kind: str, root: Path, launcher: str = "popen") -> tuple[dict[Any, Any], Path]:
    """Launch the scenario (one job, or two torchrun agents) and return every rank's outcome and the log dir."""
    log_dir = root / f"{scenario.replace(':', '-')}-{kind}-{launcher}"
    log_dir.mkdir(parents=True)
    args = [str(SCRIPT), scenario.split(":")[0], kind, str(log_dir)]
    if launcher == "torchrun":
        jobs = two_node_torchrun(args, clean_env(LAUNCHER="torchrun", NUM_NODES="2"), log_dir)
    else:
        jobs = [Job([sys.executable, *args], clean_env(LAUNCHER=launcher), log_dir / "job.log")]
    deadline = time.monotonic() + RUN_TIMEOUT
    codes = [job.wait(deadline - time.monotonic()) for job in jobs]
    for job in jobs:
        job.kill()
    outputs = "\n".join(job.output() for job in jobs)
    assert None not in codes, f"{scenario} ({kind}, {launcher}) hung for {RUN_TIMEOUT:.0f}s:\n{outputs}"
    if kind == "ours":  # the checks' threads end with the run: a thread left in a torch call aborts the exit
        assert "terminate called" not in outputs and -signal.SIGABRT not in codes, outputs
    outcomes = {path.stem.split("_", 1)[1]: json.loads(path.read_text()) for path in log_dir.glob("outcome_*.json")}
    expected = {"parent"} if launcher == "spawn" else {"0", "1"}
    assert set(outcomes) == expected, f"outcomes {sorted(outcomes)}:\n{outputs}"
    return outcomes, log_dir


def diverged_at(log_dir: Path) -> float:
    marks = [float(path.read_text()) for path in log_dir.glob("diverged_*")]
    assert marks, f"no rank reached the divergence in {log_dir}"
    return min(marks)


def rows_kept(log_dir: Path, rank: str) -> int:
    path = log_dir / "run" / f"rank_{rank}" / "metrics.csv"
    return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0


# the scenarios run under the default launcher here: the others' pitfalls run in every hook at 2, 3 and 4 ranks in
# tests/checks/test_pitfall_matrix.py, and here only under spawn and torchrun (and stock)
POPEN = (
    "log_on_rank_zero_epoch_end",
    "uneven_iterable_train",
    "barrier_on_rank_zero",
    "all_gather_on_rank_zero",
    "all_gather_on_rank_zero_in_validation:debug",
    "sigterm_on_one_rank",
)
SPAWN = ("uneven_train", "log_on_rank_zero_step", FAILING_RANK)
TORCHRUN = ("uneven_train", "log_dir_on_rank_zero", FAILING_RANK)
Runs = dict[tuple[str, str], "Future[tuple[dict[Any, Any], Path]]"]


@pytest.fixture(scope="module")
def ours(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, stock_jobs: object
) -> Iterator[Runs]:
    """The launched runs with our strategy that the selected tests check, two at a time in the background, in the
    order the tests ask for them. A job spends most of its time in one rank's imports while the other rank waits, so
    two jobs share the two cores."""
    tests = {f"test_every_rank_raises_the_named_error_within_the_limit[{s}]": (s, "popen") for s in POPEN}
    tests["test_a_failing_rank_ends_every_rank_with_its_traceback"] = (FAILING_RANK, "popen")
    tests |= {f"test_spawn_shows_the_named_error[{s}]": (s, "spawn") for s in SPAWN}
    tests |= {f"test_torchrun_two_nodes_end_with_the_named_error[{s}]": (s, "torchrun") for s in TORCHRUN}
    selected = {item.name for item in request.session.items}
    root = tmp_path_factory.mktemp("ours")
    kinds = {scenario: kind for scenario, (kind, *_) in EXPECTED.items()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {
            run: pool.submit(run_scenario, run[0], kinds.get(run[0], "ours"), root, run[1])
            for name, run in tests.items()
            if name in selected
        }
        pool.shutdown(cancel_futures=True)  # the runs already started end within RUN_TIMEOUT


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT)
@pytest.mark.parametrize("scenario", POPEN)
def test_every_rank_raises_the_named_error_within_the_limit(scenario: str, ours: Runs) -> None:
    _, error, first, fragments, rows = EXPECTED[scenario]
    outcomes, log_dir = ours[scenario, "popen"].result()
    messages = {outcome["message"] for outcome in outcomes.values()}
    assert {outcome["error"] for outcome in outcomes.values()} == {error}, outcomes
    assert len(messages) == 1, f"the ranks raised different messages: {outcomes}"
    message = messages.pop()
    for fragment in first:
        assert fragment in message.splitlines()[0], f"{fragment!r} not in the first line of:\n{message}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not named in:\n{message}"
    latency = max(outcome["at"] for outcome in outcomes.values()) - diverged_at(log_dir)
    assert latency <= LIMIT, f"the last rank raised {latency:.1f}s after the divergence"
    for rank in ("0", "1"):  # buffered per-rank rows (flush_every_n_rows=1000) were written before the error
        assert rows_kept(log_dir, rank) >= rows, f"rank {rank} kept {rows_kept(log_dir, rank)} row(s)"


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT)
def test_a_failing_rank_ends_every_rank_with_its_traceback(ours: Runs) -> None:
    outcomes, log_dir = ours[FAILING_RANK, "popen"].result()
    assert (outcomes["1"]["error"], outcomes["1"]["message"]) == ("ValueError", "boom on rank 1")
    assert outcomes["0"]["error"] == "RankFailedError"
    for fragment in ("Rank 1 failed with ValueError: boom on rank 1", "--- rank 1 traceback ---", "in training_step"):
        assert fragment in outcomes["0"]["message"]
    assert max(outcome["at"] for outcome in outcomes.values()) - diverged_at(log_dir) <= LIMIT
    assert rows_kept(log_dir, "0") >= 2 and rows_kept(log_dir, "1") >= 2


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT)
@pytest.mark.parametrize("scenario", SPAWN)
def test_spawn_shows_the_named_error(scenario: str, ours: Runs) -> None:
    outcomes, _ = ours[scenario, "spawn"].result()
    message = outcomes["parent"]["message"]
    if scenario == FAILING_RANK:
        assert "ValueError: boom on rank 1" in message
    else:
        _, error, first, fragments, _ = EXPECTED[scenario]
        assert error in message and all(fragment in message for fragment in (*first, *fragments)), message


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT)
@pytest.mark.parametrize("scenario", TORCHRUN)
def test_torchrun_two_nodes_end_with_the_named_error(scenario: str, ours: Runs) -> None:
    outcomes, log_dir = ours[scenario, "torchrun"].result()
    if scenario == FAILING_RANK:
        assert outcomes["1"]["error"] == "ValueError" and outcomes["0"]["error"] == "RankFailedError"
    else:
        _, error, first, fragments, _ = EXPECTED[scenario]
        assert {outcome["error"] for outcome in outcomes.values()} == {error}
        assert all(fragment in outcomes["0"]["message"].splitlines()[0] for fragment in first), outcomes["0"]
        assert all(fragment in outcomes["0"]["message"] for fragment in fragments), outcomes["0"]
    assert max(outcome["at"] for outcome in outcomes.values()) - diverged_at(log_dir) <= LIMIT


# stock DDPStrategy on the same scripts: these hang until the process-group timeout (30 minutes by default)
STOCK_HANGS = (
    "uneven_train",
    "uneven_iterable_train",
    "log_on_rank_zero_epoch_end",
    "log_on_rank_zero_step",
    "metric_on_some_ranks",
    "log_dir_on_rank_zero",
    "save_checkpoint_on_rank_zero",
    "barrier_on_rank_zero",
    "broadcast_on_rank_zero",
    "all_gather_on_rank_zero",
    "all_gather_on_rank_zero_in_validation",
    "sigterm_on_one_rank",
)


@pytest.fixture(scope="module")
def stock_jobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StaggeredJobs]:
    """Every scenario with stock ``DDPStrategy``, started one after another from when this module starts (if the stock
    test is selected): a hung job only waits, so they hang in the background while the other tests run, and the last
    test looks at them."""
    root = tmp_path_factory.mktemp("stock")
    wanted = any(
        item.name == "test_stock_ddp_hangs_or_ends_without_naming_the_culprit" for item in request.session.items
    )
    commands = {}
    for scenario in [*sorted(EXPECTED), FAILING_RANK] if wanted else []:
        log_dir = root / scenario
        log_dir.mkdir()
        commands[scenario] = ([sys.executable, str(SCRIPT), scenario, "stock", str(log_dir)], clean_env(), log_dir)
    jobs = StaggeredJobs(commands, "diverged_*")
    yield jobs
    jobs.kill()


@pytest.fixture(autouse=True, scope="module")
def _start_stock_first(stock_jobs: StaggeredJobs) -> None:
    """Start the stock jobs before the first test of this module."""


@pytest.mark.slow
@pytest.mark.stock
@pytest.mark.timeout(600)
def test_stock_ddp_hangs_or_ends_without_naming_the_culprit(stock_jobs: StaggeredJobs) -> None:
    """Stock ``DDPStrategy`` on every scenario: these hang past the cut-off; none names its culprit."""
    deadline = time.monotonic() + 500
    settled: dict[str, str] = {}
    while len(settled) < len(stock_jobs.log_dirs) and time.monotonic() < deadline:
        for scenario, job in list(stock_jobs.started.items()):
            log_dir = stock_jobs.log_dirs[scenario]
            if scenario in settled:
                continue
            if not job.running():
                settled[scenario] = "ended"
            elif list(log_dir.glob("diverged_*")) and time.time() - diverged_at(log_dir) > STOCK_CUTOFF:
                settled[scenario] = "hung"
        time.sleep(1)
    report = {scenario: settled.get(scenario, "did not reach the divergence") for scenario in stock_jobs.log_dirs}
    for scenario in STOCK_HANGS:
        assert report[scenario] == "hung", report
    for scenario, log_dir in stock_jobs.log_dirs.items():
        outcomes = [json.loads(path.read_text()) for path in log_dir.glob("outcome_*.json")]
        assert not [o for o in outcomes if o["error"] in _OUR_ERRORS], f"stock {scenario}: {outcomes}"
        if scenario in EXPECTED and report[scenario] == "ended":  # it ended: with no error naming the culprit
            fragments = EXPECTED[scenario][2] + EXPECTED[scenario][3]
            for outcome in outcomes:
                assert not outcome["message"] or not all(f in outcome["message"] for f in fragments), outcome


_OUR_ERRORS = {"UnevenBatchesError", "DivergentLoggingError", "DivergentCollectiveError", "RankFailedError"}


# ---- a list of ranks followed by a count reads one way only --------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("world", "others"), [(3, "ranks 0 and 2"), (8, "ranks 0 and 2-7")])
def test_the_uneven_batches_first_line_reads_one_way_at_3_and_8_ranks(tmp_path: Path, world: int, others: str) -> None:
    """The demo's pitfall at 3 and 8 ranks, launched: rank 1 reads 6 batches, every other rank 4. The ranks with 4 end
    with "and" before the count of rank 1, so "ranks 0, 2, 6 on rank 1" (ranks 0, 2 and 6?) cannot be written."""
    outcomes = run_pitfall("uneven_batches", world, str(tmp_path), timeout=500)
    first = {outcome["message"].splitlines()[0] for outcome in outcomes}
    assert {outcome["error"] for outcome in outcomes} == {"UnevenBatchesError"}, outcomes
    assert first == {
        f"Uneven data in training epoch 0: the train dataloader has 4 batches on {others} but 6 on rank 1."
        " Fix: as many batches on every rank, or uneven_batches='truncate'."
    }
