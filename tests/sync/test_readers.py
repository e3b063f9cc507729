"""Every reader of a synced value sees stock's value, whichever hook logged it and wherever the reader sits.

A callback and the module log synced values, a different one on each rank, in ``on_train_batch_end``,
``on_validation_batch_end``, ``on_train_epoch_end`` and ``on_validation_epoch_end`` (tests/helpers/reader_tasks.py).
Under stock ``DDPStrategy`` and under ``PolicyDDPStrategy()`` (the coalesced sync), at 2 and 3 ranks, with the logging
callback first in the list and last, every rank must see the same: what a callback reads in each hook, what
``ModelCheckpoint`` kept (files and scores) and ``EarlyStopping`` decided, each monitoring a callback's or the
module's key, rank 0's ``metrics.csv``, and the trainer's metrics at the end. The values sum exactly in any order:
equal means bit for bit.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

TASK = "tests.helpers.reader_tasks:fit"


def _same(ours: Any, stock: Any) -> bool:
    """Equal, NaN equal to NaN, through lists, tuples and dictionaries."""
    if isinstance(stock, dict):
        return isinstance(ours, dict) and ours.keys() == stock.keys() and all(_same(ours[k], stock[k]) for k in stock)
    if isinstance(stock, (list, tuple)):
        return len(ours) == len(stock) and all(_same(a, b) for a, b in zip(ours, stock, strict=True))
    if isinstance(stock, float) and math.isnan(stock):
        return isinstance(ours, float) and math.isnan(ours)
    return bool(ours == stock)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("logging_first", [True, False], ids=["logging_callback_first", "logging_callback_last"])
def test_every_reader_sees_stocks_value(rank_pools: Any, tmp_path: Path, world: int, logging_first: bool) -> None:
    pool = rank_pools(world)
    stock = pool.run(TASK, (str(tmp_path / "stock"), True, logging_first), timeout=240)
    ours = pool.run(TASK, (str(tmp_path / "ours"), False, logging_first), timeout=240)
    for rank in range(world):
        for what in ("monitors", "callback_metrics", "logged_metrics", "progress_bar_metrics", "csv", "epochs"):
            assert _same(ours[rank][what], stock[rank][what]), (rank, what, ours[rank][what], stock[rank][what])
        assert len(ours[rank]["reads"]) == len(stock[rank]["reads"])
        for read, reference in zip(ours[rank]["reads"], stock[rank]["reads"], strict=True):
            assert _same(read, reference), (rank, read, reference)
    # the program reaches every reader: each hook read, each monitor decided
    hooks = {read[0] for read in stock[0]["reads"]}
    assert hooks == {"on_train_batch_end", "on_validation_batch_end", "on_train_epoch_end", "on_validation_epoch_end"}
    assert all(state["best"] is not None for state in stock[0]["monitors"])
