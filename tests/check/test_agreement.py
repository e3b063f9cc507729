"""What the check flags is what would have frozen the job: the corpus's programs with a ``RUN`` setting, launched at 2
ranks under ``PolicyDDPStrategy``, end on every rank in the error the finding's kind names, and its first line names
the program's line that the check names (and the program marks with ``# expect:``); the correct ones run through.

Every kind whose runtime error the hang checks name runs here (``LX101``-``LX205``), in several hooks and guard forms,
with the options the README gives (``hang_checks="debug"`` for ``all_gather`` in ``training_step``). Left out: a
``torch.distributed`` call under a guard in ``training_step`` or ``on_train_batch_end`` (``LX205`` there), which ends
in the stall report (tests/check/corpus/dist_in_training_step.py has no ``RUN``). A divergence in
``on_train_batch_end`` at the epoch's first batch, with a batch to come, is named too: the other ranks wait in the next
step's DDP forward pass, whose bucket rebuild the hang checks record (this test found that gap).

The programs run in three launched jobs at once (``tests/helpers/scripts/check_programs.py``), each one after another,
started with this module's first test, as tests/checks/test_pitfall_matrix.py runs its scenarios.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lightning_ext.check import check_paths
from lightning_ext.check.codes import BY_CODE
from tests.helpers.check_corpus import expected_findings, programs, run_settings
from tests.helpers.jobs import REPO, Job, clean_env, server_ports

pytestmark = pytest.mark.ci  # launched jobs, minutes of start-up CPU: make test leaves them to CI (make test-ci)

SCRIPT = REPO / "tests" / "helpers" / "scripts" / "check_programs.py"
JOB_TIMEOUT = 600.0  # one job's programs, in seconds (about 40 s on a quiet 2-core machine)
JOBS = 3
RUNS = [path for path in programs() if run_settings(path) is not None]
Outcomes = Callable[[str], dict[int, dict[str, Any]]]


def _run(paths: list[Path], out: Path) -> tuple[int | None, str]:
    out.mkdir(parents=True)
    env = clean_env(PORTS=",".join(map(str, server_ports(len(paths)))))
    job = Job([sys.executable, str(SCRIPT), str(out), "2", *map(str, paths)], env, out / "job.log")
    code = job.wait(JOB_TIMEOUT)
    job.kill()
    return code, job.output(12000)


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcomes]:
    """Every rank's outcome of a program, from the job that ran it (the selected programs, in three jobs at once)."""
    mine = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    selected = [path for path in RUNS if any(item.callspec.params.get("path") == path for item in mine)]
    root = tmp_path_factory.mktemp("agreement")
    shares = [selected[index::JOBS] for index in range(JOBS)]
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        jobs: list[Future[tuple[int | None, str]]] = [
            pool.submit(_run, share, root / f"job{index}") for index, share in enumerate(shares) if share
        ]

        def read(name: str) -> dict[int, dict[str, Any]]:
            index = next(index for index, share in enumerate(shares) if any(path.name == name for path in share))
            code, output = jobs[index].result()
            found = {rank: root / f"job{index}" / f"{Path(name).stem}.{rank}.json" for rank in range(2)}
            missing = [rank for rank, path in found.items() if not path.exists()]
            assert not missing, f"job {index}: exit {code}, no outcome of rank {missing} for {name}:\n{output}"
            return {rank: json.loads(path.read_text()) for rank, path in found.items()}

        yield read
        pool.shutdown(cancel_futures=True)


def _named_lines(first: str, program: str) -> list[int]:
    """The lines of ``program`` that a first line names (``file.py:LINE)``; a long file name is cut with ``...``)."""
    lines = []
    for name, line in re.findall(r"([\w.]+):(\d+)\)", first):
        if name == program or (name.endswith("...") and program.startswith(name[:-3])):
            lines.append(int(line))
    return lines


@pytest.mark.slow
@pytest.mark.timeout(2 * JOB_TIMEOUT)
@pytest.mark.parametrize("path", [pytest.param(path, id=path.stem) for path in RUNS])
def test_the_run_ends_in_the_error_the_check_names_on_the_line_it_names(path: Path, outcomes: Outcomes) -> None:
    expected = expected_findings(path)
    findings = check_paths([path]).findings
    assert [(finding.line, finding.code) for finding in findings] == expected  # as the program states
    ranks = outcomes(path.name)
    if not expected:
        assert [outcome["error"] for outcome in ranks.values()] == [None, None], ranks
        return
    messages = {outcome["message"] for outcome in ranks.values()}
    assert len(messages) == 1, f"the ranks raised different messages: {ranks}"
    first = (messages.pop() or "").splitlines()[0] if ranks[0]["message"] else ""
    named = _named_lines(first, path.name)
    codes = dict(expected)  # a program with several findings: the run ends at the first it reaches
    assert len(named) == 1 and named[0] in codes, f"none of the lines {sorted(codes)} named in the first line:\n{first}"
    error = BY_CODE[codes[named[0]]].error
    assert {outcome["error"] for outcome in ranks.values()} == {error}, ranks
