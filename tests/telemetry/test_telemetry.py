"""Per-rank telemetry in real ``Trainer.fit`` runs (gloo, CPU): ranks made slow on purpose are found, by phase."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest

from lightning_ext import PerRankMetrics, read_rank_metrics
from lightning_ext.cli import main
from lightning_ext.rank_metrics import read_rank_hosts
from lightning_ext.rank_spread import find_stragglers
from tests.helpers.logging_scenarios import full_script

pytestmark = pytest.mark.slow

DELAY = 0.04  # seconds per batch added on purpose: far above the noise of a step here (a few ms)
BATCHES = 12
PHASES = ["data_wait_s", "forward_s", "backward_s", "optimizer_s", "collectives_s", "gradient_wait_s"]
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def slowed_run(rank_pools: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One 4-rank fit: rank 1 slow in data loading, rank 2 slow in its training step; every batch sampled.

    Four ranks, so that each straggler's "others" hold two ranks that are not slow: with three, rank 1's others were
    rank 0 and rank 2, their median half a straggler, and rank 2's noise on a loaded machine could hide rank 1.
    """
    root = tmp_path_factory.mktemp("slowed")
    results = rank_pools(4).run(
        "tests.helpers.telemetry_tasks:fit", (str(root),), timeout=180, slow_data=1, slow_compute=2, delay=DELAY
    )
    return Path(results[0]["log_dir"]), results


def test_the_verdict_names_each_slowed_rank_and_its_phase(slowed_run: tuple[Path, list[dict[str, Any]]]) -> None:
    log_dir, results = slowed_run
    found = find_stragglers(read_rank_metrics(log_dir))
    assert sorted(zip(found["rank"], found["phase"], found["pattern"])) == [
        (1, "data loading", "chronic"), (2, "forward", "chronic")
    ]  # fmt: skip
    for record in found.itertuples():
        # how much slower: the delay added, per batch. Its own time in the phase holds the whole sleep (load only adds
        # to a sleep); what the others spend there is their own noise, far below half the delay even when loaded
        assert record.seconds >= DELAY, record
        assert DELAY / 2 <= record.excess_s <= record.seconds, record
        assert record.rows == BATCHES - 1  # the first row, the warm-up, is left out
    assert all(result["warnings"] == [] for result in results)


def test_the_command_gives_the_same_verdict(slowed_run: tuple[Path, list[dict[str, Any]]], capsys: Any) -> None:
    log_dir, _ = slowed_run
    assert main(["ranks", str(log_dir), "--stragglers", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert sorted((s["rank"], s["phase"]) for s in document["stragglers"]) == [(1, "data loading"), (2, "forward")]
    assert {s["host"] for s in document["stragglers"]} == {socket.gethostname()}
    assert main(["ranks", str(log_dir), "--stragglers"]) == 0
    text = capsys.readouterr().out
    assert "stragglers (2 rank(s)), the costliest first:" in text and "data loading" in text and "forward" in text
    assert "memory, the most loaded host: host " + socket.gethostname() in text


def test_every_rank_has_every_column_with_plausible_values(slowed_run: tuple[Path, list[dict[str, Any]]]) -> None:
    log_dir, results = slowed_run
    table = read_rank_metrics(log_dir)
    memory = psutil.virtual_memory().total
    for rank in range(4):
        rows = table[(table["rank"] == rank) & table["telemetry/step_s"].notna()]
        assert list(rows["step"]) == list(range(BATCHES))  # one row per batch, at Lightning's logging step
        phases = rows[[f"telemetry/{name}" for name in PHASES]]
        assert phases.notna().all().all() and (phases >= 0).all().all()
        # the phases are parts of the step
        assert (phases.sum(axis=1) <= rows["telemetry/step_s"] * 1.001).all()
        assert (rows["telemetry/step_s"] >= DELAY * 0.9).all()  # every rank waits for the slow ones each step
        # memory is read at the first row, then at most once a second of the run (its steps' time, however loaded)
        read = rows[rows["telemetry/rss_bytes"].notna()]
        assert 1 <= len(read) <= 2 + rows["telemetry/step_s"].sum() and read["step"].iloc[0] == 0
        assert ((read["telemetry/rss_bytes"] > 50 * 2**20) & (read["telemetry/rss_bytes"] < memory)).all()
        assert (read["telemetry/workers_rss_bytes"] == 0).all()  # num_workers=0: no DataLoader worker
        assert ((read["telemetry/host_used_bytes"] > 0) & (read["telemetry/host_used_bytes"] <= memory)).all()
        assert "telemetry/cuda_allocated_bytes" not in table.columns  # CPU
        # the delays land where they were put: data loading on rank 1, the training step on rank 2
        slowed = {1: "telemetry/data_wait_s", 2: "telemetry/forward_s"}.get(rank)
        if slowed is not None:
            assert (rows[slowed].iloc[1:] >= DELAY * 0.9).all(), rows[slowed]
        # the others wait for rank 2 in the synced loss's collective, not in their forward: theirs is shorter than
        # rank 2's (its own computation and the delay) by most of the delay, both measured in this run
        slow = table[(table["rank"] == 2) & table["telemetry/step_s"].notna()]["telemetry/forward_s"].median()
        assert rank == 2 or rows["telemetry/forward_s"].median() < slow - DELAY / 2
    hosts = read_rank_hosts(log_dir)
    assert hosts["host"].tolist() == [socket.gethostname()] * 4
    assert hosts["pid"].tolist() == [result["pid"] for result in results]
    assert (hosts["host_memory_bytes"] == memory).all()


def test_files_without_telemetry_are_byte_identical_to_before(rank_pools: Any, tmp_path: Path) -> None:
    """The golden files were written by main before telemetry existed, from the same fit (telemetry_tasks.py)."""
    off = Path(rank_pools(2).run("tests.helpers.telemetry_tasks:logged_fit", (str(tmp_path / "off"),), timeout=120,
                                 telemetry=False)[0])  # fmt: skip
    for rank in range(2):
        assert (off / f"rank_{rank}" / "metrics.csv").read_bytes() == (GOLDEN / f"rank_{rank}.csv").read_bytes()
        assert not (off / f"rank_{rank}" / "metrics.csv.host").exists()
    # with telemetry on, the metric rows are the same rows with the same values, the telemetry rows besides them
    on = Path(rank_pools(2).run("tests.helpers.telemetry_tasks:logged_fit", (str(tmp_path / "on"),), timeout=120,
                                telemetry=True)[0])  # fmt: skip
    for rank in range(2):
        golden = pd.read_csv(GOLDEN / f"rank_{rank}.csv")
        mine = pd.read_csv(on / f"rank_{rank}" / "metrics.csv")
        telemetry = [name for name in mine.columns if name.startswith("telemetry/")]
        metric_rows = mine[mine["telemetry/step_s"].isna()].drop(columns=telemetry).reset_index(drop=True)
        pd.testing.assert_frame_equal(metric_rows, golden)
        assert mine["telemetry/step_s"].notna().sum() == 6  # 2 epochs x 3 batches


def test_telemetry_adds_no_collective(rank_pools: Any, tmp_path: Path) -> None:
    pool = rank_pools(2)
    kwargs: dict[str, Any] = {"epochs": 1, "batches": 3, "count": True}
    runs = {
        on: pool.run(
            "tests.helpers.logging_scenarios:fit",
            (str(tmp_path / str(on)), full_script(2)),
            timeout=120,
            strategy={"per_rank_metrics": PerRankMetrics(telemetry=on, telemetry_every_n_steps=1)},
            **kwargs,
        )
        for on in (False, True)
    }
    for rank in range(2):
        assert runs[True][rank]["collectives"] == runs[False][rank]["collectives"], f"rank {rank}"
    table = read_rank_metrics(runs[True][0]["log_dir"])
    assert table["telemetry/step_s"].notna().sum() == 2 * 3


def test_a_failing_sample_stops_telemetry_on_that_rank_only(rank_pools: Any, tmp_path: Path) -> None:
    results = rank_pools(3).run(
        "tests.helpers.telemetry_tasks:fit", (str(tmp_path),), timeout=180, delay=0.0, fail_memory_rank=1
    )
    assert [len(result["warnings"]) for result in results] == [0, 1, 0]
    assert "Per-rank telemetry of rank 1 stopped: OSError: injected (while sampling)" in results[1]["warnings"][0]
    table = read_rank_metrics(results[0]["log_dir"])
    samples = table.groupby("rank")["telemetry/step_s"].count().to_dict()
    assert samples == {0: BATCHES, 1: 0, 2: BATCHES}  # rank 1's first reading of its memory failed
    losses = table.groupby("rank")["loss"].count().to_dict()
    assert losses == {0: BATCHES, 1: BATCHES, 2: BATCHES}  # the metric rows went on
