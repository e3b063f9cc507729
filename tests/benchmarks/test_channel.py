"""The checks' channel benchmarks (issue 39): the model on paper, and the channel and launched-fit benchmarks (smoke).

The model's counts are checked against hand-derived ones (recursive doubling: ``ceil(log2 W)`` rounds, two more beyond
the largest power of two; stock: ``2N + 1`` calls); the smoke runs' timings are not judged (speed belongs to the full
runs), only that each writes its files with every subject and configuration.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.channel import model

pytestmark = (
    pytest.mark.ci
)  # benchmark smoke runs: minutes of start-up CPU on 2 cores, so make test leaves them to CI (make test-ci)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("world_size", [2, 8, 64, 1024, 4096])
def test_a_check_takes_log2_rounds_at_a_power_of_two_and_stock_2n_plus_1_calls(world_size: int) -> None:
    rounds = math.ceil(math.log2(world_size))
    assert model.check_us(world_size, round_us=10.0, alpha_us=40.0) == pytest.approx(rounds * 50.0)
    for values in (1, 5, 20):
        assert model.stock_us(world_size, values) == pytest.approx(
            (2 * values + 1) * model.nccl_allreduce_us(world_size)
        )
    # gloo's ring: 2 (W - 1) messages one after the other, Python once
    assert model.ring_check_us(world_size, round_us=10.0, alpha_us=40.0) == pytest.approx(
        2 * (world_size - 1) * 40 + 10
    )


def test_ranks_beyond_a_power_of_two_take_two_rounds_more() -> None:
    assert model.check_us(12, round_us=0.0, alpha_us=1.0) == pytest.approx(3 + 2)  # 8 in the doubling, 4 folded in


def test_stock_costs_more_per_step_with_more_values_and_the_check_does_not() -> None:
    rows = model.model_rows(round_us=30.0)
    for size in {row["world_size"] for row in rows}:
        mine = sorted((row for row in rows if row["world_size"] == size), key=lambda row: row["values"])
        assert [row["stock_us"] for row in mine] == sorted(row["stock_us"] for row in mine)
        assert len({row["ours_us"] for row in mine}) == 1  # the check and one all-reduce, however many values


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_channel_benchmark_smoke_times_every_subject_with_and_without_a_busy_thread(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.channel", "--smoke", "--out", str(tmp_path), "--machine", "m"]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    document = json.loads((tmp_path / "channel-m.json").read_text())
    found = {(row["world_size"], row["busy"], row["subject"]) for row in document["rows"]}
    subjects = ("check", "barrier", "all_reduce", "broadcast")
    assert found == {(2, busy, subject) for busy in (False, True) for subject in subjects}
    assert (tmp_path / "channel-m.md").read_text().startswith("# One hang check against barrier and all_reduce")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_fits_benchmark_smoke_launches_stock_the_defaults_and_the_floor(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.fits", "--smoke", "--out", str(tmp_path), "--machine", "m"]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    document = json.loads((tmp_path / "fits-m.json").read_text())
    assert {(row["world_size"], row["config"]) for row in document["set_up"]} == {
        (2, config) for config in ("stock", "defaults", "unsynced")
    }
    assert document["metadata"]["counts"]["world_sizes"] == [2]
    assert "world sizes [2]" in (tmp_path / "fits-m.md").read_text()
