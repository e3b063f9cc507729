"""Per-rank files wherever ``CSVLogger`` writes: real ``Trainer.fit`` runs on 2 gloo ranks with ``CSVLogger`` on
``memory://``, ``file://`` and ``s3://`` (an in-process S3 server), read back with ``read_rank_metrics`` and the CLI."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from lightning_ext import read_rank_metrics
from lightning_ext.cli import main
from tests.helpers.per_rank_tasks import BATCHES, EPOCHS, WORLD, check_rows, expected_rows, run
from tests.helpers.s3 import BUCKET, s3_storage, use_s3

pytestmark = pytest.mark.slow


def test_memory_urls_give_each_rank_a_readable_file(rank_pools: Any) -> None:
    # memory:// is per process: each rank reads back its own file (and rank 0 the stock one) in its own process
    root = f"memory:///lightning-ext-{uuid.uuid4().hex}"
    results = run(rank_pools(WORLD), root, read_back=True)
    assert [r["log_dir"] for r in results] == [f"{root}/lightning_logs/v"] * WORLD
    for rank, result in enumerate(results):
        table = pd.DataFrame(result["table"])
        assert table["rank"].unique().tolist() == [rank] and result["warnings"] == []
        assert len(table) == EPOCHS * (BATCHES + 1)
        stock_steps = pd.DataFrame({"step": table["step"]})  # every rank logs the same steps
        check_rows(table, rank, stock_steps, expected_rows(rank))


def test_file_urls_are_local_files(rank_pools: Any, tmp_path: Path) -> None:
    results = run(rank_pools(WORLD), f"file://{tmp_path}")
    log_dir = tmp_path / "lightning_logs" / "v"
    stock = pd.read_csv(log_dir / "metrics.csv")
    table = read_rank_metrics(f"file://{log_dir}")
    pd.testing.assert_frame_equal(table, read_rank_metrics(log_dir))
    for rank in range(WORLD):
        assert (log_dir / f"rank_{rank}" / "metrics.csv").is_file()
        check_rows(table, rank, stock, expected_rows(rank))
    assert results[0]["warnings"] == []


@pytest.mark.timeout(300)
def test_s3_urls_are_written_by_every_rank_and_read_by_the_reader_and_the_cli(
    rank_pools: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with s3_storage() as options, use_s3(options) as fs:
        root = f"s3://{BUCKET}/run-{uuid.uuid4().hex[:8]}"
        # flush every 2 rows: several part objects per rank, merged when the run ends
        results = run(rank_pools(WORLD), root, flush_every=2, s3=options)
        log_dir = f"{root}/lightning_logs/v"
        assert [r["log_dir"] for r in results] == [log_dir] * WORLD
        names = sorted(name.rsplit("/v/", 1)[1] for name in fs.find(log_dir[len("s3://") :]))
        assert names == ["metrics.csv", "rank_0/metrics.csv", "rank_1/metrics.csv"]  # parts merged and gone
        with fs.open(f"{log_dir}/metrics.csv", "rb") as handle:
            stock = pd.read_csv(handle)
        table = read_rank_metrics(log_dir)
        for rank in range(WORLD):
            check_rows(table, rank, stock, expected_rows(rank))
            assert (table["rank"] == rank).sum() == len(stock)
        assert main(["ranks", log_dir, "--metric", "own"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"{log_dir}: 2 rank(s), {2 * len(stock)} row(s), 1 metric(s)"
        assert out[2].split() == ["own", "102.5", "112.5", "102.5", "112.5", "7.07107", "0"]
