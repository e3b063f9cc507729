"""The decision record in real ``Trainer.fit`` runs: what rank 0 writes, and that it never stands in training's way."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

from tests.helpers.decision_scenarios import CKPT, TABLE_3, assert_agreed

pytestmark = pytest.mark.slow
FIT = "tests.helpers.decision_scenarios:fit"
STOPPING = {"monitor": "val_loss", "patience": 1, "mode": "min"}


def test_the_record_tells_each_decision_with_every_ranks_value_and_vote(rank_pools: Any, tmp_path: Any) -> None:
    """The worked example of docs/policies.md ("majority", 3 ranks), with EarlyStopping(patience=1) under "any".
    Votes vs each rank's own best: e0 all yes (first); e1 (3<4, 5<4, 5<4); e2 (3.5<4, 3.5<4, 4.5<4); e3 (2<3.5,
    3<3.5, 6<4.5). Rank 1 sees no improvement at e1 (5 vs 4): 'any' stops there."""
    logs = str(tmp_path / "logs")
    strategy = {"checkpoint_policy": "majority"}
    results = rank_pools(3).run(
        FIT, (str(tmp_path), strategy, TABLE_3), checkpoint=CKPT, early_stopping=STOPPING, logger=logs, timeout=90
    )
    assert_agreed(results, ("saves", "best_model_path", "should_stop"))
    record = results[0]["record"]
    assert results[0]["record_warnings"] == [] and results[0]["read_warnings"] == []
    assert [(row["epoch"], row["callback"]) for row in record] == [
        (0, "EarlyStopping"),
        (0, "RecordingCheckpoint"),  # the callback's own class name
        (1, "EarlyStopping"),
        (1, "RecordingCheckpoint"),
    ]
    assert len({row["run"] for row in record}) == 1
    for row in record:
        epoch = row["epoch"]
        assert row["values"] == tuple(TABLE_3[rank][epoch] for rank in range(3))  # each rank's own, un-synced
        assert row["world_size"] == 3 and row["monitor"] == "val_loss" and row["mode"] == "min"
    stop0, save0, stop1, save1 = record
    assert (save0["policy"], save0["votes"], save0["yes"], save0["outcome"]) == ("majority", (True,) * 3, 3, "saved")
    assert os.path.basename(save0["saved_as"]) == "epoch=0-val_loss=4.00.ckpt"
    assert math.isnan(save0["best_before"]) and save0["best_after"] == 4.0
    assert save0["reason"] == (
        "saved as epoch=0-val_loss=4.00.ckpt: every rank voted yes (its first score); 'majority' needs 2 of 3"
    )
    assert (save1["votes"], save1["yes"], save1["outcome"]) == ((True, False, False), 1, "not saved")
    assert save1["reason"] == (
        "not saved: ranks 1 and 2 voted no (5.0 is not better than its best 4.0), rank 0 voted yes; 'majority' needs"
        " 2 of 3"
    )
    assert (stop0["policy"], stop0["outcome"], stop1["outcome"]) == ("any", "go on", "stop")
    assert stop1["votes"] == (False, True, True)  # rank 0 improved (3 < 4); ranks 1 and 2 did not (5 vs 4)
    assert stop1["reason"] == (
        "stop: ranks 1 and 2 asked to stop (5.0 did not improve on its best 4.0 in 1 check, patience 1); 'any'"
        " stops when one rank asks"
    )
    assert (stop1["best_before"], stop1["best_after"]) == (4.0, 3.0)  # rank 0's own EarlyStopping state


def test_no_record_without_a_logger_when_switched_off_or_under_stock_ddp(rank_pools: Any, tmp_path: Any) -> None:
    pool = rank_pools(2)
    table = [row[:2] for row in TABLE_3[:2]]
    for name, strategy, logger in (
        ("off", {"decision_record": False}, str(tmp_path / "off")),
        ("stock", "stock", str(tmp_path / "stock")),
        ("no-logger", {}, None),
    ):
        results = pool.run(FIT, (str(tmp_path / name), strategy, table), checkpoint=CKPT, logger=logger, max_epochs=1)
        assert results[0]["saves"][0] == "epoch=0-val_loss=4.00.ckpt", name  # the decisions were made
        if logger is not None:
            assert "No decision record under" in results[0]["record"], name
    assert not any("decisions.csv" in files for _, _, files in os.walk(tmp_path))


def test_an_unwritable_record_warns_once_and_training_goes_on(rank_pools: Any, tmp_path: Any) -> None:
    logs = tmp_path / "logs"
    table = [row[:3] for row in TABLE_3[:2]]
    results = rank_pools(2).run(
        FIT, (str(tmp_path), {}, table), checkpoint=CKPT, logger=str(logs), max_epochs=3, full_disk_for="decisions.csv"
    )
    assert [result["current_epoch"] for result in results] == [3, 3]  # every epoch ran, on every rank
    (warning,) = results[0]["record_warnings"]
    assert warning.startswith("The decision record stopped: OSError: [Errno 28] No space left on device")
    assert "(while writing a row)" in warning and "keeps the 0 decision(s) written so far" in warning
    assert "Training goes on." in warning and "decisions.csv.incomplete" in warning
    marker = (logs / "v" / "decisions.csv.incomplete").read_text()
    assert '"format": "lightning-ext decision record incomplete/1"' in marker
    assert [row["current_epoch"] for row in results] == [3, 3]
    assert "there is no decisions.csv; the record stopped early after 0 row(s): OSError" in results[0]["record"]


def test_the_record_on_an_fsspec_url_and_a_resumed_run_continuing_it(rank_pools: Any, tmp_path: Any) -> None:
    """memory:// is per process: rank 0 writes its record there and reads it back in the same process. Then a run
    resumed from the last checkpoint keeps the first run's rows and adds its own, as one run's continuation."""
    pool = rank_pools(2)
    table = [row[:4] for row in TABLE_3[:2]]
    url = f"memory://{tmp_path.name}/logs"
    results = pool.run(FIT, (str(tmp_path / "m"), {}, table), checkpoint=CKPT, logger=url, max_epochs=1)
    assert [row["epoch"] for row in results[0]["record"]] == [0]
    checkpoint = dict(CKPT, save_last=True)
    logs = str(tmp_path / "logs")
    pool.run(FIT, (str(tmp_path), {}, table), checkpoint=checkpoint, logger=logs, max_epochs=2)
    last = os.path.join(str(tmp_path), "checkpoints", "last.ckpt")
    results = pool.run(
        FIT, (str(tmp_path), {}, table), checkpoint=checkpoint, logger=logs, max_epochs=4, ckpt_path=last
    )
    record = results[0]["record"]
    assert [row["epoch"] for row in record] == [0, 1, 2, 3]  # each decision once: nothing lost, none twice
    runs = [row["run"] for row in record]
    # two runs, one after the other: the first run's rows up to the resumed step, then the resumed run's (Lightning
    # makes the decision of the validation that saved last.ckpt again, and the record keeps the one made last)
    first = runs.count(runs[0])
    assert 1 <= first < 4 and len(set(runs[first:])) == 1 and runs[first] != runs[0], runs
    assert [row["values"] for row in record] == [tuple(row[epoch] for row in table) for epoch in range(4)]
