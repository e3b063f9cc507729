"""The coordinated stop in launched jobs: a signal sent from outside to one rank's process while it trains.

Under Lightning's default launcher (popen) every process exits 143, rank 0 (the parent) too, and a second launch with
``ckpt_path="last"`` ends with the uninterrupted stock run's weights and per-rank rows. Under torchrun every worker
exits 143 at the same step, with the checkpoint written.
Under SLURM (two ranks started as ``srun`` would, a stand-in ``scontrol``), Lightning's requeue signal on one rank
saves Lightning's ``hpc_ckpt`` and requeues the job once. The reference is the stock ``DDPStrategy`` run of the same
model and data in a rank pool (tests/helpers/preemption_tasks.py). The jobs run two at a time, in the background.
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

from tests.helpers.jobs import REPO, Job, clean_env, free_port
from tests.helpers.preemption_tasks import mark, rank_rows

pytestmark = pytest.mark.ci  # launched jobs, minutes of start-up CPU: make test leaves them to CI (make test-ci)

SCRIPT = REPO / "tests" / "helpers" / "scripts" / "preemption_job.py"
RUN_TIMEOUT = 150.0
SIGNAL_FROM_BATCH = 2  # rank 1 is signalled once it has started this many training batches (or more)
LATENCY = 3  # the stop comes before this many more training batches have started
CHILD_EXIT = 15.0  # seconds for a popen child to write its outcome after the parent exited


def _signal_rank_one(root: Path, job: Job, signum: int = signal.SIGTERM) -> int:
    """Once rank 1 has started ``SIGNAL_FROM_BATCH`` training batches or more, signal its process; return how many."""
    marker = root / "batch_0_1"
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline and job.running():
        text = marker.read_text().split() if marker.exists() else []
        if len(text) == 2 and int(text[1]) >= SIGNAL_FROM_BATCH:
            os.kill(int(text[0]), signum)
            return int(text[1])
        time.sleep(0.05)
    pytest.fail(f"rank 1 never started {SIGNAL_FROM_BATCH} training batches:\n{job.output()}")


def _outcomes(root: Path, attempt: int, wait: float = 0.0) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + wait
    while len(found := sorted(root.glob(f"outcome_{attempt}_*.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    return {int(path.stem.rsplit("_", 1)[1]): json.loads(path.read_text()) for path in found}


def _popen(root: Path) -> dict[str, Any]:
    """Stop a popen job, then launch it again to resume."""
    job = Job([sys.executable, str(SCRIPT), str(root)], clean_env(), root / "stop.log")
    signalled = _signal_rank_one(root, job)
    code = job.wait(RUN_TIMEOUT)
    stopped = _outcomes(root, 0, wait=CHILD_EXIT)
    job.kill()
    resume = Job([sys.executable, str(SCRIPT), str(root)], clean_env(RESUME="1"), root / "resume.log")
    resumed_code = resume.wait(RUN_TIMEOUT)
    resume.kill()
    output = job.output() + resume.output()
    return {"signalled": signalled, "codes": (code, resumed_code), "stopped": stopped, "output": output}


def _torchrun(root: Path) -> dict[str, Any]:
    """Stop a torchrun job: its workers exit 143 (the relaunch that resumes is the popen job's, the same script)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT)]
    job = Job([*command, str(root)], clean_env(), root / "stop.log")
    signalled = _signal_rank_one(root, job)
    code = job.wait(RUN_TIMEOUT)
    job.kill()
    return {"signalled": signalled, "codes": (code,), "stopped": _outcomes(root, 0), "output": job.output(20000)}


def _slurm(root: Path) -> dict[str, Any]:
    """Two ranks started as ``srun`` starts them (SLURM's variables set by hand, a stand-in ``scontrol`` on PATH)."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {root / "scontrol.calls"}\n')
    scontrol.chmod(0o755)
    port = str(free_port())
    jobs = []
    for rank in (0, 1):
        env = clean_env(
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            SLURM_NTASKS="2",
            SLURM_NTASKS_PER_NODE="2",
            SLURM_JOB_NAME="train",
            SLURM_JOB_ID="4242",
            SLURM_NODELIST="127.0.0.1",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NODEID="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        jobs.append(Job([sys.executable, str(SCRIPT), str(root)], env, root / f"rank{rank}.log", cwd=root))
    signalled = _signal_rank_one(root, jobs[1], signal.SIGUSR1)
    codes = tuple(job.wait(RUN_TIMEOUT) for job in jobs)
    for job in jobs:
        job.kill()
    output = "\n".join(job.output() for job in jobs)
    return {"signalled": signalled, "codes": codes, "stopped": _outcomes(root, 0), "output": output}


@pytest.fixture(scope="module")
def launched(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[Path, Future[dict[str, Any]]]]]:
    """The jobs of the selected tests, two at a time in the background."""
    selected = " ".join(item.name for item in request.session.items)
    runs = {
        name: run for name, run in {"popen": _popen, "torchrun": _torchrun, "slurm": _slurm}.items() if name in selected
    }
    roots = {name: tmp_path_factory.mktemp(name) for name in runs}
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {name: (roots[name], pool.submit(run, roots[name])) for name, run in runs.items()}


@pytest.fixture(scope="module")
def reference(rank_pools: Any, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("reference")
    outcomes: list[dict[str, Any]] = rank_pools(2).run("tests.helpers.preemption_tasks:reference", (str(root), 1))
    return outcomes


def _check_stop(root: Path, run: dict[str, Any]) -> None:
    """Every rank stopped at the same batch with code 143, soon after the signal, with the checkpoint written."""
    stopped, output = run["stopped"], run["output"]
    assert sorted(stopped) == [0, 1], output
    assert {outcome["code"] for outcome in stopped.values()} == {143}, output
    (batches,) = {outcome["batches"] for outcome in stopped.values()}
    # the batch rank 1 was in when signalled ends, and the stop comes before one of the next batches
    assert run["signalled"] <= batches < run["signalled"] + LATENCY, f"{batches} batches, signal in {run['signalled']}"
    assert (root / "ckpt" / "last.ckpt").exists()
    assert "lightning-ext: stopped every rank before training batch" in output


def _check_resumed(root: Path, run: dict[str, Any], reference: list[dict[str, Any]]) -> None:
    """The resumed run ends with the reference's weights and per-rank rows."""
    output = run["output"]
    resumed = _outcomes(root, 1)
    for rank in (0, 1):
        assert resumed[rank]["code"] is None, output
        assert resumed[rank]["weights"] == reference[rank]["weights"], f"rank {rank}"
        rows = [row for row in rank_rows(str(root), rank) if row["loss"]]
        assert [(int(row["step"]), float(row["loss"])) for row in rows] == reference[rank]["losses"], f"rank {rank}"
        assert [float(row["mark"]) for row in rows] == [mark(rank, int(row["step"])) for row in rows]


@pytest.mark.slow
@pytest.mark.timeout(3 * RUN_TIMEOUT)
def test_popen_every_process_exits_143_and_the_relaunch_resumes_to_the_reference(
    launched: dict[str, tuple[Path, Future[dict[str, Any]]]], reference: list[dict[str, Any]]
) -> None:
    root, future = launched["popen"]
    run = future.result()
    # rank 0 is the parent: had the child exited first, Lightning's observer would have SIGKILLed it (-9)
    assert run["codes"] == (143, 0), run["output"]
    _check_stop(root, run)
    _check_resumed(root, run, reference)


@pytest.mark.slow
@pytest.mark.timeout(3 * RUN_TIMEOUT)
def test_torchrun_workers_stop_together_and_exit_143(
    launched: dict[str, tuple[Path, Future[dict[str, Any]]]],
) -> None:
    root, future = launched["torchrun"]
    run = future.result()
    assert run["codes"] == (1,), run["output"]  # the agent reports failed workers with 1
    assert "failed (exitcode: 143)" in run["output"]  # torchelastic saw the stopped workers exit 143
    _check_stop(root, run)


@pytest.mark.slow
@pytest.mark.timeout(3 * RUN_TIMEOUT)
def test_slurm_requeue_signal_on_one_rank_requeues_once_with_lightnings_checkpoint(
    launched: dict[str, tuple[Path, Future[dict[str, Any]]]],
) -> None:
    root, future = launched["slurm"]
    run = future.result()
    stopped, output = run["stopped"], run["output"]
    assert run["codes"] == (128 + signal.SIGUSR1,) * 2, output
    assert {outcome["code"] for outcome in stopped.values()} == {128 + signal.SIGUSR1}, output
    assert len({outcome["batches"] for outcome in stopped.values()}) == 1, stopped
    assert (root / "hpc_ckpt_1.ckpt").exists(), sorted(path.name for path in root.iterdir())
    assert (root / "scontrol.calls").read_text() == "requeue 4242\n"  # by rank 0 only, once
    assert "rank 1 received SIGUSR1" in output
