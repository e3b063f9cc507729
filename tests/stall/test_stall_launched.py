"""Stalls no hang check can name, as real launched jobs: ours end with the stall report, stock hangs.

Rank 1 of ``tests/helpers/scripts/stall_job.py`` stalls at training batch 3: it computes forever, blocks in a
``torch.distributed.all_reduce`` that rank 0 never makes, is killed (``SIGKILL``), or waits for a DataLoader worker that
never returns; or rank 0 is killed under torchrun. With ``PolicyDDPStrategy(stall_timeout=5)`` every rank that can act
must raise ``StallError`` soon after the threshold (bounded so generously that only a hang breaks it), the report must
name the rank and the place, and no process may be left running. Under spawn the job keeps the default (``"auto"``) with
a process group timeout of 15 s: it is reported shortly before that timeout and ended only at it, when the waiting
collective times out. The same jobs under stock ``DDPStrategy`` are shown still hanging well past that, or (``SIGKILL``
on gloo) ending with an error that names no rank, or with no error at all when Lightning's child observer kills rank 0
first. Our jobs run two at a time in the background; the stock ones start one after another with the module, and wait
(they sleep or wait in gloo, so they cost little CPU while ours run).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.jobs import REPO, Job, StaggeredJobs, clean_env, free_port, two_node_torchrun

pytestmark = (
    pytest.mark.ci
)  # launched jobs: minutes of start-up CPU on 2 cores, so make test leaves them to CI (make test-ci)

SCRIPT = REPO / "tests" / "helpers" / "scripts" / "stall_job.py"
STALL_TIMEOUT = 5.0  # the script's
# Seconds from the stall to the last rank's error: so generous that only a hang breaks it. The report comes after the
# script's STALL_TIMEOUT and ends the run a few seconds later on a quiet machine; without it, the stalled run would
# wait for the process group's timeout (30 minutes).
LIMIT = STALL_TIMEOUT + 240.0
RUN_TIMEOUT = 600.0  # a job of ours that runs longer than this has hung (start-up and training included, under load)
AUTO = {("endless", "spawn"): 15.0}  # the cases run with the default stall_timeout: their process group timeout
# a stock job still running this long after the stall is hanging (ours end a few seconds after STALL_TIMEOUT); load
# cannot make a hanging job end sooner
STOCK_CUTOFF = STALL_TIMEOUT + 15.0


def _line_of(code: str) -> str:
    """``stall_job.py:<line>``: where ``code`` stands in the script."""
    lines = SCRIPT.read_text().splitlines()
    return f"stall_job.py:{next(n for n, line in enumerate(lines, 1) if code in line)}"


# (kind, launcher): (ranks that raise StallError, what the summary names)
EXPECTED: dict[tuple[str, str], tuple[set[str], tuple[str, ...]]] = {
    ("endless", "popen"): (
        {"0", "1"},
        ("Rank 1 is behind", "computing in training_step at", f"{SCRIPT.name}:", "in _stall"),
    ),
    ("collective_alone", "popen"): (  # rank 1 is inside C++ (gloo): it cannot raise; its process ends
        {"0"},
        ("Rank 1 is blocked in torch.distributed.all_reduce called from", _line_of("dist.all_reduce(torch.ones(1)"),
         "which rank 0 never made"),
    ),
    ("sigkill", "popen"): ({"0"}, ("Rank 1 is gone: killed by SIGKILL",)),
    ("stuck_worker", "popen"): ({"0", "1"}, ("Rank 1 is behind", "waiting for a batch from its DataLoader worker")),
    ("endless", "spawn"): ({"parent"}, ("Rank 1 is behind", "computing in training_step")),
    ("stuck_worker", "torchrun"): ({"0", "1"}, ("Rank 1 is behind", "waiting for a batch from its DataLoader worker")),
    # the first node's agent held the store and ends with rank 0: rank 1 reports alone, in a file of its own if the
    # store is already gone (it says so), else in the run's report (which of the two depends on timing)
    ("sigkill_rank0", "torchrun"): ({"1"}, ("Rank 0 is gone",)),
}  # fmt: skip
REPORTS = {"sigkill_rank0": "stall_report.rank1.txt"}  # the report's file, if not stall_report.txt


def run_job(kind: str, strategy: str, root: Path, launcher: str) -> tuple[list[Job], Path]:
    """Start the job (or two torchrun agents); return the jobs and the log dir."""
    log_dir = root / f"{kind}-{strategy}-{launcher}"
    log_dir.mkdir(parents=True)
    args = [str(SCRIPT), kind, strategy, str(log_dir)]
    timeout = AUTO.get((kind, launcher)) if strategy == "ours" else None
    auto = {"STALL_TIMEOUT": "auto", "PG_TIMEOUT": str(timeout)} if timeout else {}
    if launcher == "torchrun":
        return two_node_torchrun(args, clean_env(LAUNCHER="torchrun", NUM_NODES="2"), log_dir), log_dir
    # a port of our own: Lightning's pick is the system's (the ephemeral range), and another test's connection took it
    port = str(free_port())
    return [
        Job([sys.executable, *args], clean_env(LAUNCHER=launcher, MASTER_PORT=port, **auto), log_dir / "job.log")
    ], log_dir


def finish(kind: str, root: Path, launcher: str) -> tuple[dict[str, Any], Path, str]:
    """Run one of our jobs to its end; return every rank's outcome, the log dir and the jobs' output."""
    jobs, log_dir = run_job(kind, "ours", root, launcher)
    deadline = time.monotonic() + RUN_TIMEOUT
    codes = [job.wait(deadline - time.monotonic()) for job in jobs]
    left = [job for job in jobs if _outlives(job, 15.0)]  # before kill(): a process of the job that stays
    for job in jobs:
        job.kill()
    output = "\n".join(job.output(20000) for job in jobs)
    assert None not in codes, f"{kind} ({launcher}) hung for {RUN_TIMEOUT:.0f}s:\n{output}"
    assert not left, f"{kind} ({launcher}) left processes running:\n{output}"
    outcomes = {path.stem.split("_", 1)[1]: json.loads(path.read_text()) for path in log_dir.glob("outcome_*.json")}
    return outcomes, log_dir, output


def _outlives(job: Job, seconds: float) -> bool:
    """Whether a process of the job's process group (its session) is still there ``seconds`` after the job ended."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(job.process.pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.2)
    return True


def stalled_at(log_dir: Path) -> float:
    marks = [float(path.read_text()) for path in log_dir.glob("stalled_*")]
    assert marks, f"rank 1 never stalled in {log_dir}"
    return min(marks)


Runs = dict[tuple[str, str], "Future[tuple[dict[str, Any], Path, str]]"]


@pytest.fixture(scope="module")
def ours(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, stock_jobs: object
) -> Iterator[Runs]:
    """The selected tests' jobs with our strategy, two at a time in the background."""
    selected = {item.name for item in request.session.items}
    wanted = [
        case
        for case in EXPECTED
        if f"test_every_rank_that_can_act_raises_the_stall_error[{case[0]}-{case[1]}]" in selected
    ]
    root = tmp_path_factory.mktemp("ours")
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {case: pool.submit(finish, case[0], root, case[1]) for case in wanted}
        pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT)
@pytest.mark.parametrize(("kind", "launcher"), list(EXPECTED))
def test_every_rank_that_can_act_raises_the_stall_error(kind: str, launcher: str, ours: Runs) -> None:
    outcomes, log_dir, output = ours[kind, launcher].result()
    raising, fragments = EXPECTED[kind, launcher]
    assert set(outcomes) == raising, f"outcomes {sorted(outcomes)}:\n{output}"
    for outcome in outcomes.values():
        assert "StallError" in (outcome["error"] + outcome["message"]), outcome
        for fragment in fragments:
            assert fragment in outcome["message"], f"{fragment!r} not in:\n{outcome['message']}"
    latency = max(outcome["at"] for outcome in outcomes.values()) - stalled_at(log_dir)
    reports = [log_dir / "run" / name for name in (REPORTS.get(kind, "stall_report.txt"), "stall_report.txt")]
    report = next(path for path in reports if path.exists()).read_text()
    if reports[0].name != reports[1].name and reports[0].exists():
        assert "The store does not answer" in report, report
    group_timeout = AUTO.get((kind, launcher))
    if group_timeout is None:
        assert latency <= LIMIT, f"the last rank raised {latency:.1f}s after the stall"
    else:  # reported before the process group's timeout, ended by it (not before)
        # not before the group's timeout (load cannot make it sooner); after it, as generously as LIMIT
        assert group_timeout - 1.0 <= latency <= group_timeout + 240.0, f"ended {latency:.1f}s after the stall"
        assert "stall_timeout='auto': report 1.5 s before the process group's timeout" in report
        assert "The run ended when rank 0's collective failed: RuntimeError: Timed out waiting 15000ms" in report
    summary = next(line for line in report.splitlines() if line.startswith("Summary: "))
    assert all(fragment in summary for fragment in fragments), summary
    for rank in ("0", "1"):
        assert f"--- rank {rank}" in report
    assert "(training thread)" in report  # the answering ranks' stacks
    if raising == {"0"} and kind != "sigkill":  # rank 1 could not act: its process said so and ended
        assert "rank 1's training thread cannot be interrupted" in output


# stock DDPStrategy on the same script: the stalls hang until the process group's timeout (30 minutes)
STOCK_HANGS = ("endless", "collective_alone", "stuck_worker")


@pytest.fixture(scope="module")
def stock_jobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StaggeredJobs]:
    """Every kind under stock ``DDPStrategy``, started one after another from when the module starts (if the stock test
    is selected)."""
    wanted = any(item.name == "test_stock_ddp_hangs_or_ends_naming_no_rank" for item in request.session.items)
    root = tmp_path_factory.mktemp("stock")
    commands = {}
    for kind in (*STOCK_HANGS, "sigkill") if wanted else ():
        log_dir = root / f"{kind}-stock-popen"
        log_dir.mkdir(parents=True)
        commands[kind] = ([sys.executable, str(SCRIPT), kind, "stock", str(log_dir)], clean_env(), log_dir)
    jobs = StaggeredJobs(commands, "stalled_*")
    yield jobs
    jobs.kill()


@pytest.fixture(autouse=True, scope="module")
def _start_stock_first(stock_jobs: StaggeredJobs) -> None:
    """Start the stock jobs before the first test of this module."""


@pytest.mark.slow
@pytest.mark.stock
@pytest.mark.timeout(400)
def test_stock_ddp_hangs_or_ends_naming_no_rank(stock_jobs: StaggeredJobs) -> None:
    deadline = time.monotonic() + 340
    settled: dict[str, str] = {}
    while len(settled) < len(stock_jobs.log_dirs) and time.monotonic() < deadline:
        for kind, job in list(stock_jobs.started.items()):
            log_dir = stock_jobs.log_dirs[kind]
            if kind in settled:
                continue
            if not job.running():
                settled[kind] = "ended"
            elif list(log_dir.glob("stalled_*")) and time.time() - stalled_at(log_dir) > STOCK_CUTOFF:
                settled[kind] = "hung"
        time.sleep(1)
    assert {kind: settled.get(kind) for kind in STOCK_HANGS} == dict.fromkeys(STOCK_HANGS, "hung"), settled
    assert settled.get("sigkill") == "ended", settled  # gloo notices a dead peer at once
    job, log_dir = stock_jobs.started["sigkill"], stock_jobs.log_dirs["sigkill"]
    outcome_file = log_dir / "outcome_0.json"
    if outcome_file.exists():  # gloo's error reached rank 0 first: it names no rank
        outcome = json.loads(outcome_file.read_text())
        assert outcome["error"] and "rank 1" not in outcome["message"].lower(), outcome
    else:  # Lightning's child observer (a 5 s poll) SIGKILLed rank 0 before gloo's error reached it: no error at all
        assert job.process.returncode == -signal.SIGKILL, (job.process.returncode, job.output())
    assert not (log_dir / "run" / "stall_report.txt").exists()
