"""The pitfalls at 16 ranks, as a new user meets them: launched jobs of 16 processes on this machine.

The founding pitfall (``if self.trainer.is_global_zero: self.log(..., sync_dist=True)``), an ``all_gather`` under a
rank guard and a stream that runs out first on rank 15 each end with the named error, the same first line on all 16
ranks; a correct program whose rank 15 is slower than every threshold completes on all 16. Each is one launch of 16
processes: about 30 s on two idle cores, minutes on a loaded or slower machine. The founding pitfall's job is CI's
(marker ``ci``); the other three are marked ``scale`` (``make test-scale`` runs the whole file), for CI's budget.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.jobs import REPO, Job, clean_env

SCRIPTS = REPO / "tests" / "helpers" / "scripts"
WORLD = 16
TIMEOUT = 600.0  # sixteen processes importing torch and Lightning on two cores: only a hang outlasts this


def _line(code: str) -> int:
    lines = (SCRIPTS / "hang_scenarios.py").read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if code in text)


LOGGED = _line('self.log("rank_zero_only_loss"')
GATHERED = _line("self.all_gather(value)")
# scenario: (error on every rank, the first line)
EXPECTED = {
    "log_on_rank_zero_step": (
        "DivergentLoggingError",
        f"self.log('rank_zero_only_loss', sync_dist=True) in training_step (hang_scenarios.py:"
        f"{LOGGED}) synced on rank 0 only; ranks 1-15 did not sync it. Fix: log it"
        " on every rank, or with rank_zero_only=True.",
    ),
    "all_gather_on_rank_zero_in_validation": (
        "DivergentCollectiveError",
        "torch.distributed.all_gather (via LightningModule.all_gather) in validation_step (hang_scenarios.py:"
        f"{GATHERED}) ran on rank 0 only; ranks 1-15 went on. Fix: call it on every rank.",
    ),
    "stream_short_on_last_rank": (
        "UnevenBatchesError",
        "Uneven data in epoch 0: the train dataloader ran out after 4 batch(es) on rank 15 while ranks 0-14 had more."
        " Fix: as many batches on every rank.",
    ),
}


def _outcomes(out: Path, command: list[str]) -> dict[int, dict[str, Any]]:
    out.mkdir()
    job = Job(command, clean_env(DEVICES=str(WORLD)), out / "job.log")
    code = job.wait(TIMEOUT)
    job.kill()
    found = {int(path.stem.split("_")[1]): json.loads(path.read_text()) for path in out.glob("outcome_[0-9]*.json")}
    assert code is not None and sorted(found) == list(range(WORLD)), (
        f"exit {code}, ranks {sorted(found)}\n{job.output()}"
    )
    return found


_SLOW = {"delays": [{"rank": WORLD - 1, "phase": "grad_penalty", "how": "compute", "seconds": 3.0, "epoch": 0,
                     "batch": 1}]}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[int, dict[str, Any]]]:
    """Each job when a test first asks for it, one after another (sixteen ranks at once are enough for two cores)."""
    root = tmp_path_factory.mktemp("sixteen")
    found: dict[str, dict[int, dict[str, Any]]] = {}

    def run(scenario: str) -> dict[int, dict[str, Any]]:
        if scenario not in found:
            out = root / scenario
            script = ["slow_rank_job.py", str(out), "ddp", json.dumps(_SLOW)] if scenario == "slow" else [
                "hang_scenarios.py", scenario, "ours", str(out)]  # fmt: skip
            found[scenario] = _outcomes(out, [sys.executable, str(SCRIPTS / script[0]), *script[1:]])
        return found[scenario]

    return run


# CI runs the founding pitfall's job; the rest are make test-scale's
_MARKS = {
    scenario: pytest.mark.ci if scenario == "log_on_rank_zero_step" else pytest.mark.scale for scenario in EXPECTED
}


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT)
@pytest.mark.parametrize("scenario", [pytest.param(name, marks=_MARKS[name]) for name in sorted(EXPECTED)])
def test_every_one_of_sixteen_ranks_names_the_pitfall_in_the_first_line(scenario: str, runs: Any) -> None:
    error, first = EXPECTED[scenario]
    outcomes = runs(scenario)
    for rank, outcome in outcomes.items():
        assert outcome["error"] == error, (rank, outcome)
        assert outcome["message"].splitlines()[0] == first, (rank, outcome["message"])
    assert len({outcome["message"] for outcome in outcomes.values()}) == 1


@pytest.mark.scale
@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT)
def test_a_correct_program_with_one_slow_rank_of_sixteen_completes(runs: Any) -> None:
    outcomes = runs("slow")
    for rank, outcome in outcomes.items():
        assert outcome["error"] is None, (rank, outcome["message"])
        assert outcome["stall_report"] is None, (rank, outcome["stall_report"])
    assert len({json.dumps(outcome["weights"]) for outcome in outcomes.values()}) == 1  # DDP kept every rank alike
    assert any(outcome["looks"] for outcome in outcomes.values()), "no rank waited past the first threshold"
