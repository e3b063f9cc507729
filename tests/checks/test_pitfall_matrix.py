"""Every pitfall of the README's table, in every hook and stage where users put it, in real launched jobs: the first
line of the error every rank raises names the true cause, the user's file and line, and the fix.

One job per world size (2 ranks: every scenario; 3 ranks: every one but some at an epoch's first batch; 4 ranks: a
representative part) runs its scenarios one after another (``tests/helpers/scripts/pitfall_matrix.py``): each a
default ``Trainer`` (sanity check, checkpointing and logger on) with ``PolicyDDPStrategy()`` (``hang_checks="debug"``
where a scenario says ``+debug``). They cannot interfere: each fit starts a new process group, and a rank that a
scenario left blocked in a collective is released before the next. The jobs start together in the background with
this module's first test: they spend most of their time waiting (a rank left behind is found after 2 s). The expected
first lines are written out here, from the script's own lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.jobs import REPO, Job, clean_env, server_ports

pytestmark = (
    pytest.mark.ci
)  # launched jobs: minutes of start-up CPU on 2 cores, so make test leaves them to CI (make test-ci)

SCRIPT = REPO / "tests" / "helpers" / "scripts" / "pitfall_matrix.py"
# Seconds from the first rank reaching the pitfall to the last rank's error: so generous that only a hang breaks it. A
# check ends a scenario in a few seconds on a quiet machine; a hang lasts until the process group's timeout (30
# minutes).
LIMIT = 300.0
FIRST_LINE = 200  # characters
# Seconds without a new outcome in a job: a hang (so generous that nothing else reaches it; a scenario takes a few
# seconds, a loaded machine's first one a minute). The job is then asked for every rank's stacks, its scenario fails
# with them, and a new job runs the scenarios after it (at most RELAUNCHES times).
STALLED = 600.0
RELAUNCHES = 2
JOB_TIMEOUT = 1800.0  # the scenarios' own time in a world's jobs (about 90 s on a quiet 2-core machine; 10x loaded)
WORLD_TIMEOUT = JOB_TIMEOUT + RELAUNCHES * STALLED  # plus the time each hang stepped over costs

PLACES = (
    "sanity:validation_step",
    "sanity:on_validation_epoch_end",
    "training_step",
    "on_train_batch_end",
    "on_train_epoch_end",
    "validation_step",
    "on_validation_epoch_end",
    "test_step",
    "on_test_epoch_end",
)
# the calls under `if self.trainer.is_global_zero:` (keys: every rank logs a key of its own); in training_step and
# on_train_batch_end a logged metric does not sync (a step value), and an unchecked all_gather or torch.distributed
# call meets the other ranks' DDP gradient all-reduce, which no check stands before (hang_checks="debug" checks
# every all_gather: tests/checks/test_launched.py; a raw torch.distributed call there is the stall report's)
CALLS = ("log", "metric", "keys", "log_dir", "save_checkpoint", "barrier", "broadcast", "all_gather", "all_reduce")
IN_TRAINING_STEPS = ("log", "keys", "log_dir", "save_checkpoint", "barrier", "broadcast")
EVERY = [
    f"{call}@{place}"
    for call in CALLS
    for place in PLACES
    if call in IN_TRAINING_STEPS or place not in ("training_step", "on_train_batch_end")
] + ["uneven@train", "uneven@val", "uneven@test", "uneven@stream"]
# at the first of 3 training batches, with a BatchNorm layer: in on_train_batch_end the other ranks go on into the next
# step's DDP forward pass, which broadcasts the buffers and the rebuilt gradient buckets' order (in training_step, into
# the backward pass); all_gather with hang_checks="debug", which checks it there
FIRST_SOME = [
    "log@first:on_train_batch_end",
    "barrier@first:on_train_batch_end",
    "all_gather@first:on_train_batch_end+debug",
    "log@first:training_step",
]
FIRST = [
    *FIRST_SOME,
    *(f"{call}@first:on_train_batch_end" for call in ("log_dir", "save_checkpoint", "broadcast")),
    "barrier@first:training_step",
    "all_gather@first:training_step+debug",
]
SOME = [
    "log@sanity:on_validation_epoch_end",
    "log@training_step",
    "log@on_train_epoch_end",
    "metric@validation_step",
    "keys@test_step",
    "log_dir@on_train_batch_end",
    "save_checkpoint@on_validation_epoch_end",
    "barrier@training_step",
    "broadcast@test_step",
    "all_gather@on_validation_epoch_end",
    "all_reduce@sanity:validation_step",
    "uneven@train",
    "uneven@stream",
]
# a raw torch.distributed call by torch 2.13's new name (the deprecated all_gather_into_tensor names it)
NEW_NAMES = ["all_gather_single@on_validation_epoch_end"]
WORLDS = {2: EVERY + FIRST + NEW_NAMES, 3: EVERY + FIRST_SOME, 4: SOME + FIRST_SOME + NEW_NAMES}


def _line(marker: str) -> int:
    """The script's line that ends with ``marker`` (the call the first line must name)."""
    lines = SCRIPT.read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.rstrip().endswith(marker))


def _others(world: int) -> str:
    return {2: "rank 1", 3: "ranks 1 and 2"}.get(world, f"ranks 1-{world - 1}")


def expected(scenario: str, world: int) -> tuple[str, str | tuple[str, ...]]:
    """``(error class, how the first line starts)`` for ``scenario`` at ``world`` ranks, from the script alone (a
    tuple: the starts it may have)."""
    call, place = scenario.removesuffix("+debug").split("@")
    hook = place.split(":")[-1]
    where = f" in {hook} ({'sanity check, ' if place.startswith('sanity:') else ''}pitfall_matrix.py:"
    if call == "uneven":
        stage = {"train": "training epoch 0", "val": "the sanity check", "test": "test"}.get(place)
        if stage is None:  # the stream: rank 0's ran out first, the others have a batch more; whether theirs ran
            # out too before the ranks compared is a matter of time, and the first line says which
            head = "Uneven data in epoch 0: the train dataloader ran out after 2 batch(es) on rank 0"
            return "UnevenBatchesError", (
                f"{head} while {_others(world)} had more.",
                f"{head} but after 3 on {_others(world)}.",
            )
        name = "train dataloader" if place == "train" else f"{place} dataloader 0"
        counts = "2" if place == "val" else "3"  # the sanity check runs 2 batches at most
        return "UnevenBatchesError", f"Uneven data in {stage}: the {name} has 1 batch on {_others(world)} but {counts}"
    line = _line(f"# pitfall: {call}")
    if call == "keys":
        more = f", {world - 2} more rank(s) other keys" if world > 2 else ""
        text = (
            f"Synced logging differs between ranks{where}{line}): rank 0 syncs 'part_0', rank 1 syncs 'part_1'{more}."
        )
        return "DivergentLoggingError", text
    logged = {"log": "self.log('val_acc', sync_dist=True)", "metric": "self.log('val_mean', <metric>)"}
    if call in logged:
        return "DivergentLoggingError", f"{logged[call]}{where}{line}) synced on rank 0 only; {_others(world)} went on."
    made = {
        "log_dir": "Trainer.log_dir (strategy.broadcast)",
        "save_checkpoint": "Trainer.save_checkpoint (strategy.barrier)",
        "barrier": "strategy.barrier()",
        "broadcast": "strategy.broadcast(src=0)",
        "all_gather": "LightningModule.all_gather (strategy.all_gather)"  # checked before it runs
        if scenario.endswith("+debug")
        else "torch.distributed.all_gather (via LightningModule.all_gather)",
        "all_reduce": "torch.distributed.all_reduce",
        "all_gather_single": "torch.distributed.all_gather_single",
    }[call]
    return "DivergentCollectiveError", f"{made}{where}{line}) ran on rank 0 only; {_others(world)} went on."


Outcomes = Callable[[int, str], dict[int, dict[str, Any]]]


def _outcomes(out: Path) -> set[str]:
    return {path.name for path in out.glob("*.json")}


def _missing(out: Path, world: int, scenario: str) -> list[int]:
    return [rank for rank in range(world) if not (out / f"{scenario}.{rank}.json").exists()]


class _Run:
    """A world's jobs: the first runs every scenario; after a hang, the next runs the scenarios after the hung one."""

    def __init__(self, world: int, out: Path) -> None:
        self.world, self.out = world, out
        self.hangs: dict[str, str] = {}  # scenario: what the job said then (its stacks)
        self.code: int | None = 0
        self.output = ""

    def run(self) -> None:
        self.out.mkdir(parents=True)
        scenarios, deadline = WORLDS[self.world], time.monotonic() + WORLD_TIMEOUT
        for launch in range(RELAUNCHES + 1):
            hung = self._job(scenarios, self.out / f"job{launch}.log", deadline)
            if hung is None:
                return
            if hung not in scenarios:  # every scenario ended, but the job did not
                self.code, self.output = None, self.hangs.pop(hung)
                return
            scenarios = scenarios[scenarios.index(hung) + 1 :]
            if not scenarios:
                return

    def _job(self, scenarios: list[str], log: Path, deadline: float) -> str | None:
        """Run ``scenarios`` in one job; the scenario it hung in (no new outcome for ``STALLED`` seconds), if any."""
        env = clean_env(PORTS=",".join(map(str, server_ports(len(scenarios)))))
        job = Job([sys.executable, str(SCRIPT), str(self.out), str(self.world), *scenarios], env, log)
        seen, since = _outcomes(self.out), time.monotonic()
        while job.wait(1.0) is None and time.monotonic() < deadline:
            now = _outcomes(self.out)
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > STALLED:
                return self._hang(job, scenarios)
        self.code = job.wait(0)
        job.kill()
        self.output = job.output(12000)
        return None

    def _hang(self, job: Job, scenarios: list[str]) -> str:
        """Have every rank write its stacks (the script's SIGUSR2 handler), say so in the job's log, end the job."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.process.pid, signal.SIGUSR2)
        time.sleep(5.0)  # the handlers write at once, even on a rank blocked in C++: this is plenty
        hung = next((scenario for scenario in scenarios if _missing(self.out, self.world, scenario)), "its exit")
        stacks = "".join(f"--- rank {rank}'s Python stacks ---\n{self._stacks(rank)}\n" for rank in range(self.world))
        note = (
            f"pitfall_matrix: no scenario ended for {STALLED:.0f} s: {hung} hangs (no outcome from ranks "
            f"{_missing(self.out, self.world, hung)}); every rank's Python stacks:\n{stacks}"
        )
        before = job.output(6000)
        with job.log.open("a") as handle:
            handle.write(f"\n{note}")
        job.kill()
        self.hangs[hung] = f"{note}\n--- the job's output before ---\n{before}"
        return hung

    def _stacks(self, rank: int) -> str:
        path = self.out / f"stacks.{rank}.txt"
        return (path.read_text(errors="replace") if path.exists() else "") or "(none: the rank did not answer)"


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcomes]:
    """Every rank's outcome of a scenario, from the job of its world size (the selected jobs run at once)."""
    mine = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    selected = {item.callspec.params["world"] for item in mine}
    root = tmp_path_factory.mktemp("pitfalls")
    runs = {world: _Run(world, root / f"world{world}") for world in sorted(selected)}
    with ThreadPoolExecutor(max_workers=len(WORLDS)) as pool:
        jobs: dict[int, Future[None]] = {world: pool.submit(run.run) for world, run in runs.items()}

        def read(world: int, scenario: str) -> dict[int, dict[str, Any]]:
            jobs[world].result()
            run = runs[world]
            assert scenario not in run.hangs, run.hangs[scenario]
            missing = _missing(run.out, world, scenario)
            assert run.code == 0 and not missing, (
                f"job of {world} ranks: exit {run.code}, no outcome of {missing}:\n{run.output}"
            )
            return {rank: json.loads((run.out / f"{scenario}.{rank}.json").read_text()) for rank in range(world)}

        yield read
        pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.timeout(WORLD_TIMEOUT + 600)  # the first test of a world waits for its jobs
@pytest.mark.parametrize(
    ("world", "scenario"), [(world, scenario) for world, scenarios in WORLDS.items() for scenario in scenarios]
)
def test_every_rank_raises_an_error_whose_first_line_names_the_true_cause(
    world: int, scenario: str, outcomes: Outcomes
) -> None:
    error, start = expected(scenario, world)
    ranks = outcomes(world, scenario)
    assert {outcome["error"] for outcome in ranks.values()} == {error}, ranks
    messages = {outcome["message"] for outcome in ranks.values()}
    assert len(messages) == 1, f"the ranks raised different messages: {ranks}"
    first = messages.pop().splitlines()[0]
    assert first.startswith(start), f"expected the first line to start with\n{start}\nbut it is\n{first}"
    assert len(first) <= FIRST_LINE, first
    latency = max(outcome["ended"] for outcome in ranks.values()) - min(
        outcome["diverged"] or time.time() for outcome in ranks.values()
    )
    assert latency <= LIMIT, f"the last rank raised {latency:.1f}s after the first reached the pitfall"
