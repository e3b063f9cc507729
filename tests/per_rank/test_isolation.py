"""Per-rank output never ends or stalls a run: real ``Trainer.fit`` runs on 2 gloo ranks with a fault on rank 1.

In each run: training completes on every rank; rank 1 gets exactly one ``RankMetricsWarning`` naming its file and the
error, its file keeps the rows written before the fault and is marked incomplete; rank 0 gets no warning and its file
is complete. Expected cells come from the value formula in ``tests/helpers/per_rank_tasks.py`` and the steps and
epochs from stock Lightning's own ``metrics.csv``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from lightning_ext import read_rank_metrics
from lightning_ext.rank_metrics import RankMetricsWarning, incomplete_ranks
from tests.helpers.per_rank_tasks import BATCHES, EPOCHS, WORLD, check_rows, expected_rows, run

pytestmark = pytest.mark.slow


def check_isolated(results: list[dict[str, Any]], error: str, rows: int, marker: str, **shape: bool) -> None:
    log_dir = Path(results[0]["log_dir"])
    file = log_dir / "rank_1" / "metrics.csv"
    assert results[0]["warnings"] == []
    (warning,) = results[1]["warnings"]
    assert warning.startswith("Per-rank metrics of rank 1 stopped: ") and error in warning and str(file) in warning
    assert f"marked incomplete in {log_dir / marker}" in warning and "Training goes on" in warning
    record = json.loads((log_dir / marker).read_text(encoding="utf-8"))
    assert record["rank"] == 1 and record["rows_written"] == rows and error in record["reason"]
    stock = pd.read_csv(log_dir / "metrics.csv")
    with pytest.warns(RankMetricsWarning, match=r"rank 1: .* is incomplete: stopped early after") as caught:
        table = read_rank_metrics(log_dir)
    assert len(caught) == 1
    assert incomplete_ranks(log_dir) == {1: caught[0].message.args[0].split(" is incomplete: ")[1].split(" (marker")[0]}
    check_rows(table, 0, stock, expected_rows(0, **shape))
    assert (table["rank"] == 0).sum() == len(stock) == EPOCHS * (BATCHES + 1)  # rank 0's file is complete
    assert (table["rank"] == 1).sum() == rows
    if rows:
        check_rows(table, 1, stock, expected_rows(1, **shape))
        assert record["last_step"] == table[table["rank"] == 1]["step"].iloc[-1]


def test_a_full_disk_on_one_rank(rank_pools: Any, tmp_path: Path) -> None:
    # rank 1's third write fails: two flushes of 2 rows each (both rewrites: new columns) made it to the file
    results = run(rank_pools(WORLD), tmp_path, flush_every=2, fault="enospc")
    check_isolated(results, "[Errno 28] No space left on device", 4, "rank_1/metrics.csv.incomplete")


def test_a_file_where_the_rank_directory_should_be(rank_pools: Any, tmp_path: Path) -> None:
    results = run(rank_pools(WORLD), tmp_path, fault="dir_is_file")
    # the marker cannot go beside the file: it goes in the log directory
    check_isolated(results, "FileExistsError", 0, "rank_1_metrics.csv.incomplete")
    assert "(while opening the file)" in results[1]["warnings"][0]
    assert not (Path(results[1]["log_dir"]) / "rank_1").is_dir()


def test_a_torchmetrics_metric_whose_local_compute_fails_on_one_rank(rank_pools: Any, tmp_path: Path) -> None:
    results = run(rank_pools(WORLD), tmp_path, failing_metric_rank=1)
    # rank 1 stops at the first epoch-end row; its 3 step rows, buffered, are written when it stops
    check_isolated(results, "RuntimeError: local compute failed on rank 1", 3, "rank_1/metrics.csv.incomplete", tm=True)
    stock = pd.read_csv(Path(results[0]["log_dir"]) / "metrics.csv")
    synced = [100.0 * epoch + 10 * (WORLD - 1) / 2 + (BATCHES - 1) / 2 for epoch in range(EPOCHS)]
    assert stock["tm"].dropna().tolist() == synced  # Lightning's synced value on rank 0 was not disturbed


def test_a_metric_named_rank_round_trips(rank_pools: Any, tmp_path: Path) -> None:
    results = run(rank_pools(WORLD), tmp_path, log_rank=True)
    assert [r["warnings"] for r in results] == [[]] * WORLD
    log_dir = Path(results[0]["log_dir"])
    stock = pd.read_csv(log_dir / "metrics.csv")
    assert stock["rank"].dropna().unique().tolist() == [(WORLD - 1) / 2]  # stock logs the synced mean as "rank"
    table = read_rank_metrics(log_dir)
    assert incomplete_ranks(log_dir) == {}
    for rank in range(WORLD):
        check_rows(table, rank, stock, expected_rows(rank, log_rank=True))
        assert (table["rank"] == rank).sum() == len(stock)
    assert not math.isnan(table["metric:rank"].iloc[0])
