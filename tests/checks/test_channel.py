"""The hang checks' channel on a real network of two hosts: namespaces the test creates (tests/helpers/hosts.py).

On ``nodea`` its own name resolves to ``127.0.1.1``, as on many clusters, and ``MASTER_ADDR=nodea``: the route to it
is the loopback there. The job's training group connects through the interface between the hosts (an NCCL job's
would find its own); then the channel must find that interface by itself, never the loopback, and work. With
``GLOO_SOCKET_IFNAME=lo`` it cannot connect (each host's loopback is its own): every rank says so within the option's
seconds, alike, and goes on without the checks, or raises ``CheckChannelError`` where the run needs them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.hosts import ADDRESSES, INTERFACE, skip_unless_possible, two_hosts
from tests.helpers.jobs import REPO, Job, clean_env

pytestmark = (
    pytest.mark.ci
)  # launched jobs: minutes of start-up CPU on 2 cores, so make test leaves them to CI (make test-ci)

SCRIPT = REPO / "tests" / "helpers" / "scripts" / "channel_job.py"
TIMEOUT = 150.0  # a job that runs longer has hung
BOUND = 60.0  # seconds a failing channel may take to be reported (5 s allowed; only a 30-minute wait breaks this)
SCENARIOS = ("auto", "lo", "lo_truncate")


def _run(work: Path, prefixes: dict[str, list[str]], scenario: str) -> dict[int, dict[str, Any]]:
    out = work / scenario
    out.mkdir()
    env = clean_env(MASTER_ADDR="nodea", MASTER_PORT="29500", WORLD_SIZE="2", LOCAL_RANK="0")
    env["GLOO_SOCKET_IFNAME"] = INTERFACE  # the training group's; the job sets the channel's
    jobs = [
        Job([*prefixes[host], sys.executable, str(SCRIPT), str(out), scenario],
            {**env, "RANK": str(rank), "NODE_RANK": str(rank)}, out / f"rank{rank}.log")
        for rank, host in enumerate(ADDRESSES)
    ]  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    codes = [job.wait(deadline - time.monotonic()) for job in jobs]
    for job in jobs:
        job.kill()
    outputs = "\n".join(f"--- rank {rank} ---\n{job.output()}" for rank, job in enumerate(jobs))
    assert codes == [0, 0], f"{scenario}: exit codes {codes}\n{outputs}"
    return {rank: json.loads((out / f"outcome_{rank}.json").read_text()) for rank in range(2)}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, dict[str, Any]]]:
    skip_unless_possible()
    work = tmp_path_factory.mktemp("hosts")
    with two_hosts(work) as prefixes:
        return {scenario: _run(work, prefixes, scenario) for scenario in SCENARIOS}


def _line(code: str) -> int:
    return next(number for number, text in enumerate(SCRIPT.read_text().splitlines(), 1) if code in text)


@pytest.mark.slow
@pytest.mark.timeout(4 * TIMEOUT)
def test_the_channel_binds_the_interface_that_reaches_master_addr_not_the_loopback(outcomes: Any) -> None:
    auto = outcomes["auto"]
    assert auto[0]["route"].startswith("127.")  # rank 0's own route to MASTER_ADDR is the loopback (the premise) ...
    assert auto[1]["route"] == ADDRESSES["nodeb"]
    first = (
        f"self.log('loss', sync_dist=True) in training_step (channel_job.py:{_line('self.log(')}) synced on rank 0"
        " only; rank 1 went on. Fix: log it on every rank, or with rank_zero_only=True."
    )
    for rank in (0, 1):  # ... yet the checks work across the hosts: the founding pitfall is named on both
        assert auto[rank]["error"] == "DivergentLoggingError", auto[rank]
        assert auto[rank]["message"].splitlines()[0] == first
        assert auto[rank]["warnings"] == []


def _first_line_names_both_ranks(first: str) -> None:
    assert first.startswith("lightning-ext's hang checks could not connect their channel within 5 s: rank "), first
    for rank, host in enumerate(ADDRESSES):
        assert f"rank {rank} ({host}, interface lo (127.0.0.1) from GLOO_SOCKET_IFNAME)" in first, first


@pytest.mark.slow
@pytest.mark.timeout(4 * TIMEOUT)
def test_a_channel_that_cannot_connect_warns_alike_on_every_rank_within_seconds_and_the_run_goes_on(
    outcomes: Any,
) -> None:
    lo = outcomes["lo"]
    assert lo[0]["warnings"] == lo[1]["warnings"] and len(lo[0]["warnings"]) == 1, lo
    first, second, third = lo[0]["warnings"][0].splitlines()
    _first_line_names_both_ranks(first)
    assert "binds the interface that reaches MASTER_ADDR (nodea) unless GLOO_SOCKET_IFNAME names one" in second
    assert second.endswith("(GLOO_SOCKET_IFNAME=lo here).")
    assert third.endswith("The run goes on without hang checks (as with hang_checks=False).")
    for rank in (0, 1):
        assert lo[rank]["error"] is None and lo[rank]["global_step"] == 4, lo[rank]
        assert lo[rank]["seconds"] < BOUND, lo[rank]


@pytest.mark.slow
@pytest.mark.timeout(4 * TIMEOUT)
def test_a_channel_that_cannot_connect_is_one_error_on_every_rank_where_the_run_needs_the_checks(
    outcomes: Any,
) -> None:
    truncate = outcomes["lo_truncate"]
    assert {outcome["error"] for outcome in truncate.values()} == {"CheckChannelError"}, truncate
    assert truncate[0]["message"] == truncate[1]["message"]
    _first_line_names_both_ranks(truncate[0]["message"].splitlines()[0])
    assert truncate[0]["message"].endswith("uneven_batches='truncate' needs the checks, so the run stops here.")
    assert all(outcome["seconds"] < BOUND for outcome in truncate.values()), truncate
