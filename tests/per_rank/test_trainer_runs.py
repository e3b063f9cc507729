"""Per-rank metrics in real ``Trainer.fit`` runs on 2 and 3 CPU ranks (gloo), side by side with stock Lightning."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from lightning_ext import read_rank_metrics
from tests.helpers.logging_scenarios import BATCHES, EPOCHS, full_script
from tests.helpers.metrics_reference import expected_cells, forked, observed_cells

pytestmark = pytest.mark.slow


def _columns(script: dict[str, list[dict[str, Any]]]) -> tuple[set[str], set[str], set[str]]:
    step = {forked(e, True) for e in script["train"] if e["options"].get("on_step")}
    train_epoch = {forked(e, False) for e in script["train"] if e["options"].get("on_epoch", True)}
    zero_only = {forked(e, False) for stage in script.values() for e in stage if e["options"].get("rank_zero_only")}
    return step, train_epoch, zero_only


def _run(pool: Any, root: Path, script: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
    kwargs.setdefault("epochs", EPOCHS)
    kwargs.setdefault("batches", BATCHES)
    kwargs.setdefault("val_dataloaders", 2)
    return pool.run("tests.helpers.logging_scenarios:fit", (str(root), script), timeout=120, **kwargs)


@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.both_packages), 3])
def test_per_rank_files_hold_local_values_and_stock_file_is_unchanged(
    rank_pools: Any, tmp_path: Path, world: int
) -> None:
    pool = rank_pools(world)
    script = full_script(world)
    stock = _run(pool, tmp_path / "stock", script, strategy="stock")
    ours = _run(pool, tmp_path / "ours", script, strategy={"per_rank_metrics": True, "checkpoint_policy": "mean"})
    stock_csv = Path(stock[0]["log_dir"]) / "metrics.csv"
    our_dir = Path(ours[0]["log_dir"])
    assert {r["log_dir"] for r in ours} == {str(our_dir)}  # one version directory on every rank

    # rank 0's stock metrics.csv: byte for byte what a stock run writes; callbacks see the same synced values
    assert (our_dir / "metrics.csv").read_bytes() == stock_csv.read_bytes()
    assert [r["callback_metrics"] for r in ours] == [r["callback_metrics"] for r in stock]

    step_columns, epoch_columns, zero_only = _columns(script)
    expected = expected_cells(script, world, EPOCHS, BATCHES)
    stock_table = pd.read_csv(stock_csv)
    # the reference agrees with stock Lightning's synced values (so it is a fair judge of the local ones)
    assert observed_cells(stock_table, BATCHES, step_columns, epoch_columns) == expected["synced"]

    table = read_rank_metrics(our_dir)
    assert sorted(table["rank"].unique()) == list(range(world))
    for rank in range(world):
        mine = table[table["rank"] == rank].drop(columns=["rank"]).dropna(axis=1, how="all").reset_index(drop=True)
        # same rows, same steps and epochs as stock's file; the same columns, less rank-0-only values elsewhere
        assert list(mine["step"]) == list(stock_table["step"])
        assert list(mine["epoch"]) == list(stock_table["epoch"])
        stock_columns = set(stock_table.columns) - (zero_only if rank else set())
        assert set(mine.columns) == stock_columns
        assert observed_cells(mine, BATCHES, step_columns, epoch_columns) == expected[rank], f"rank {rank}"


@pytest.mark.both_packages
def test_per_rank_metrics_add_no_collective(rank_pools: Any, tmp_path: Path) -> None:
    pool = rank_pools(2)
    script = full_script(2)
    off = _run(pool, tmp_path / "off", script, strategy={"per_rank_metrics": False}, count=True)
    on = _run(pool, tmp_path / "on", script, strategy={"per_rank_metrics": True}, count=True)
    for rank in range(2):
        assert on[rank]["collectives"] == off[rank]["collectives"], f"rank {rank}"
        assert on[rank]["steps"] == off[rank]["steps"] == EPOCHS * BATCHES
    assert sum(on[0]["collectives"].values()) > 0  # the counter does see collectives (metric syncs, decisions)


@pytest.mark.parametrize(
    ("loggers", "where"),
    [
        ("csv", "lightning_logs/version_0"),
        ("tensorboard", "lightning_logs/version_0"),
        ("several", "tb/version_0"),  # the first logger's directory, as Trainer.log_dir has it
        ("none", "."),  # no logger: under default_root_dir
    ],
)
@pytest.mark.both_packages
def test_files_land_in_the_run_log_dir_for_every_logger_setup(
    rank_pools: Any, tmp_path: Path, loggers: str, where: str
) -> None:
    script = {"train": full_script(2)["train"][:2]}
    results = _run(rank_pools(2), tmp_path, script, loggers=loggers, val_dataloaders=1)
    directory = (tmp_path / where).resolve()
    assert {Path(r["log_dir"]).resolve() for r in results} == {directory}
    for rank in range(2):
        assert (directory / f"rank_{rank}" / "metrics.csv").is_file()
        # TensorBoard event files per rank only when the first logger is a TensorBoardLogger
        events = list((directory / f"rank_{rank}").glob("events.out.tfevents.*"))
        assert len(events) == (1 if loggers in ("tensorboard", "several") else 0), loggers
    expected_loggers = {
        "csv": ["CSVLogger"],
        "tensorboard": ["TensorBoardLogger"],
        "several": ["TensorBoardLogger", "CSVLogger"],
        "none": [],
    }
    assert all(r["loggers_after"] == expected_loggers[loggers] for r in results)  # the trainer's loggers as given
    assert len(read_rank_metrics(directory)) > 0


@pytest.mark.both_packages
def test_ranks_adopt_rank_zero_version_where_stock_ranks_diverge(rank_pools: Any, tmp_path: Path) -> None:
    """Lightning #18294: rank 0 creates version_0 before rank 1 resolves its version; stock rank 1 picks version_1."""
    pool = rank_pools(2)
    stock = pool.run("tests.helpers.logging_scenarios:version_race", (str(tmp_path / "stock"), "stock"), timeout=120)
    ours = pool.run("tests.helpers.logging_scenarios:version_race", (str(tmp_path / "ours"), "ours"), timeout=120)
    assert [Path(d).name for d in stock] == ["version_0", "version_1"]
    assert [Path(d).name for d in ours] == ["version_0", "version_0"]


@pytest.mark.both_packages
def test_resume_keeps_earlier_rows_without_duplicating_steps(rank_pools: Any, tmp_path: Path) -> None:
    pool = rank_pools(2)
    script = {"train": full_script(2)["train"][:2]}
    common = {
        "strategy": {"per_rank_metrics": True},
        "batches": BATCHES,
        "version": "run",
        "checkpoint_every_epoch": True,
        "timeout": 120,
    }
    pool.run("tests.helpers.logging_scenarios:fit", (str(tmp_path), script), epochs=1, **common)
    directory = tmp_path / "lightning_logs" / "run"
    first = read_rank_metrics(directory)
    resumed_script = {"train": full_script(2)["train"][:2]}  # values for 2 epochs
    last = str(tmp_path / "ckpt" / "last.ckpt")
    assert os.path.isfile(last)
    pool.run("tests.helpers.logging_scenarios:fit", (str(tmp_path), resumed_script), epochs=2, ckpt_path=last, **common)
    after = read_rank_metrics(directory)
    for rank in range(2):
        before_rows = first[first["rank"] == rank].reset_index(drop=True)
        rows = after[after["rank"] == rank].reset_index(drop=True)
        # the first epoch's rows are still there, unchanged, and the second epoch follows once
        pd.testing.assert_frame_equal(rows.iloc[: len(before_rows)], before_rows, check_dtype=False)
        steps = rows["step"].tolist()
        step_rows = rows.dropna(subset=["loss_step"])
        assert step_rows["step"].is_unique and step_rows["step"].tolist() == list(range(2 * BATCHES))
        assert steps == sorted(steps)
    # stock CSVLogger deleted its own history on the second run; the per-rank files kept it
    stock_rows = pd.read_csv(directory / "metrics.csv")
    assert stock_rows["epoch"].min() == 1


@pytest.mark.both_packages
def test_synced_weighted_mean_with_uneven_batch_sizes_is_exact(rank_pools: Any, tmp_path: Path) -> None:
    """Stock Lightning on gloo averages the int batch-size counter with truncation (3.5 where (1*1 + 3*2) / 3 = 2.33,
    tests/strategies/test_synced_means.py); under lightning-ext's strategies the synced value is the exact weighted
    mean, and the per-rank files hold each rank's own value."""
    entry = {
        "name": "m",
        "options": {"on_step": False, "on_epoch": True, "sync_dist": True},
        "values": [[[1.0]], [[3.0]]],
        "batch_sizes": [[[1]], [[2]]],
    }
    results = rank_pools(2).run(
        "tests.helpers.logging_scenarios:fit", (str(tmp_path), {"train": [entry]}), epochs=1, batches=1, timeout=120
    )
    assert results[0]["callback_metrics"]["m"] == pytest.approx(7 / 3)
    table = read_rank_metrics(results[0]["log_dir"]).dropna(subset=["m"])
    assert table.set_index("rank")["m"].to_dict() == {0: 1.0, 1: 3.0}
