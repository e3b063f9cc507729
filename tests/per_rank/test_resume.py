"""Mid-epoch resume with per-rank metrics: real 2-rank ``Trainer.fit`` runs (gloo), resumed into the same log dir.

A run saves a checkpoint every 2 training steps and is cut short by ``max_steps=4`` (in the second epoch), as a crash
would cut it; a second run resumes from the step-2 checkpoint, taken in the middle of the first epoch, and trains to
the end. Every rank's file must hold each logged row exactly once, with the values of an uninterrupted run and of the
independent reference (:mod:`tests.helpers.metrics_reference`).

One exception is Lightning's own: a checkpoint carries no logged-metric accumulators (nor torchmetrics states), so
after a mid-epoch resume the resumed epoch's training aggregates reduce only the batches run after the resume, in
stock's synced ``metrics.csv`` as in the per-rank files. The reference for that row reduces the same batches, and
rank 0's stock file of the resumed run is checked against it too.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.metrics_reference import comparable, expected_cells, file_cells, forked
from tests.helpers.tensorboard_reference import cells as event_cells
from tests.helpers.tensorboard_reference import event_files, next_second, read_scalars

pytestmark = pytest.mark.slow

WORLD, EPOCHS, BATCHES = 2, 2, 3
RESUMED_AT = 2  # the checkpoint is taken after 2 steps: the resumed run starts at batch 2 of epoch 0


def _values(offset: float) -> list[list[list[float]]]:
    """Distinct, exactly representable values per rank, epoch and batch."""
    return [
        [[offset + 8 * rank + 2 * epoch + 0.25 * batch for batch in range(BATCHES)] for epoch in range(EPOCHS)]
        for rank in range(WORLD)
    ]


def _sizes(rank_shift: int) -> list[list[list[int]]]:
    return [
        [[1 + (rank * rank_shift + epoch + batch) % 3 for batch in range(BATCHES)] for epoch in range(EPOCHS)]
        for rank in range(WORLD)
    ]


def _script() -> dict[str, list[dict[str, Any]]]:
    def entry(name: str, offset: float, sizes: Any = None, kind: str = "tensor", **options: Any) -> dict[str, Any]:
        return {"name": name, "kind": kind, "options": options, "values": _values(offset), "batch_sizes": sizes}

    return {
        "train": [
            entry("loss", 0.0, _sizes(1), on_step=True, on_epoch=True, sync_dist=False),
            entry("loss_sync", 1.0, _sizes(0), on_step=True, on_epoch=True, sync_dist=True),
            entry("total", 2.0, on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True),
            entry("tm", 3.0, _sizes(1), kind="torchmetric", on_step=False, on_epoch=True),
        ],
        "val": [entry("val_loss", 10.0, _sizes(1), on_step=False, on_epoch=True)],
    }


def _after_resume(script: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Epoch 0's training entries, with only the batches that the resumed run trains on."""

    def cut(per_rank: Any) -> Any:
        return None if per_rank is None else [[epochs[0][RESUMED_AT:]] for epochs in per_rank]

    return {"train": [dict(e, values=cut(e["values"]), batch_sizes=cut(e["batch_sizes"])) for e in script["train"]]}


def _expected(script: dict[str, list[dict[str, Any]]]) -> dict[Any, Any]:
    """The reference cells, with epoch 0's training aggregates over the batches after the resume."""
    expected = expected_cells(script, WORLD, EPOCHS, BATCHES)
    resumed_epoch = expected_cells(_after_resume(script), WORLD, 1, BATCHES - RESUMED_AT)
    for who, cells in resumed_epoch.items():
        expected[who].update({key: value for key, value in cells.items() if key[0] == "train_epoch"})
    return expected


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.both_packages
def test_mid_epoch_resume_logs_every_row_once_with_the_uninterrupted_values(rank_pools: Any, tmp_path: Path) -> None:
    pool = rank_pools(WORLD)
    script = _script()
    common: dict[str, Any] = {
        "strategy": {"per_rank_metrics": True},
        "epochs": EPOCHS,
        "batches": BATCHES,
        "version": "run",
        "checkpoint_every_n_steps": 2,
        "timeout": 120,
    }
    straight = tmp_path / "straight"
    pool.run("tests.helpers.logging_scenarios:fit", (str(straight), script), **common)
    resumed = tmp_path / "resumed"
    cut = pool.run("tests.helpers.logging_scenarios:fit", (str(resumed), script), max_steps=4, **common)
    assert [r["steps"] for r in cut] == [4, 4]  # cut short in the second epoch
    checkpoint = resumed / "ckpt" / "epoch=0-step=2.ckpt"  # mid-epoch: after the second of three batches
    assert checkpoint.is_file(), sorted(p.name for p in (resumed / "ckpt").iterdir())
    pool.run("tests.helpers.logging_scenarios:fit", (str(resumed), script), ckpt_path=str(checkpoint), **common)

    step_columns = {forked(e, True) for e in script["train"] if e["options"]["on_step"]}
    epoch_columns = {forked(e, False) for e in script["train"] if e["options"]["on_epoch"]}
    expected = _expected(script)

    def check_cells(path: Path, want: dict[Any, Any], who: str) -> None:
        got = file_cells(path, BATCHES, step_columns, epoch_columns)
        assert comparable(got, want) == comparable(want, want), who

    run_dir = resumed / "lightning_logs" / "run"
    # stock's own file of the resumed run (stock CSVLogger dropped the earlier rows): Lightning's partial epoch 0
    stock = file_cells(run_dir / "metrics.csv", BATCHES, step_columns, epoch_columns)
    assert stock, "rank 0's metrics.csv of the resumed run is empty"
    assert comparable(stock, expected["synced"]) == comparable(
        {key: expected["synced"][key] for key in stock}, expected["synced"]
    ), "rank 0's stock metrics.csv against the reference"
    for rank in range(WORLD):
        mine = run_dir / f"rank_{rank}" / "metrics.csv"
        rows = _rows(mine)
        step_rows = [int(row["step"]) for row in rows if row["loss_step"] != ""]
        assert step_rows == list(range(EPOCHS * BATCHES)), f"rank {rank}: each training step once, in order"
        epoch_rows = [int(row["epoch"]) for row in rows if row["loss_epoch"] != ""]
        assert epoch_rows == list(range(EPOCHS)), f"rank {rank}: each epoch's row once"
        val_rows = [int(row["epoch"]) for row in rows if row["val_loss"] != ""]
        assert val_rows == list(range(EPOCHS)), f"rank {rank}: each validation row once"
        check_cells(mine, expected[rank], f"rank {rank}")
        # every row but epoch 0's training aggregates, exactly as the uninterrupted run wrote it
        uninterrupted = _rows(straight / "lightning_logs" / "run" / f"rank_{rank}" / "metrics.csv")

        def same_rows(table: list[dict[str, str]]) -> list[dict[str, str]]:
            return [row for row in table if not (row["epoch"] == "0" and row["loss_epoch"] != "")]

        assert same_rows(rows) == same_rows(uninterrupted), f"rank {rank}"


def test_mid_epoch_resume_keeps_each_step_once_in_the_event_files(rank_pools: Any, tmp_path: Path) -> None:
    """The same cut and resume with a TensorBoardLogger: each rank's event files hold each tag at each step once,
    with the reference's values (the events after the checkpoint's step, written by the cut run, are gone from the
    files themselves, whatever a reader would make of them)."""
    pool = rank_pools(WORLD)
    script = _script()
    common: dict[str, Any] = {
        "strategy": {"per_rank_metrics": True},
        "loggers": "tensorboard",
        "epochs": EPOCHS,
        "batches": BATCHES,
        "version": "run",
        "checkpoint_every_n_steps": 2,
        "timeout": 120,
    }
    cut = pool.run("tests.helpers.logging_scenarios:fit", (str(tmp_path), script), max_steps=4, **common)
    assert [r["steps"] for r in cut] == [4, 4]
    run_dir = tmp_path / "lightning_logs" / "run"
    before = {rank: read_scalars(run_dir / f"rank_{rank}") for rank in range(WORLD)}
    assert all(max(step for step, _ in found["loss_step"]) == 3 for found in before.values())  # past the checkpoint
    checkpoint = tmp_path / "ckpt" / "epoch=0-step=2.ckpt"
    next_second()  # the resumed run's event file sorts after the cut run's, in TensorBoard's order, as in a new process
    pool.run("tests.helpers.logging_scenarios:fit", (str(tmp_path), script), ckpt_path=str(checkpoint), **common)

    step_columns = {forked(e, True) for e in script["train"] if e["options"]["on_step"]}
    epoch_columns = {forked(e, False) for e in script["train"] if e["options"]["on_epoch"]}
    expected = _expected(script)
    for rank in range(WORLD):
        found = read_scalars(run_dir / f"rank_{rank}")  # every event file of the rank, the cut run's too
        assert len(event_files(run_dir / f"rank_{rank}")) == 2  # the cut run's (cut back) and the resumed run's
        assert [step for step, _ in found["loss_step"]] == list(range(EPOCHS * BATCHES)), f"rank {rank}"
        got = event_cells(found, BATCHES, step_columns, epoch_columns)  # (raises on a tag written twice at one step)
        assert comparable(got, expected[rank]) == comparable(expected[rank], expected[rank]), f"rank {rank}"
