"""What a read inside the logging hook, right after ``self.log``, sees, and what the user learns of it
(docs/synced-logging.md).

Under the coalesced sync, ``trainer.callback_metrics[key]`` holds this rank's own value until the hook returns; stock
(and ``log_sync="per_value"``) hold the synced value there. Such a read is never silent: it raises
``UnsyncedReadWarning`` once per line, whose first line names the key, the file and line, what stock gives there and
the fix. The read makes no collective: under ``if trainer.is_global_zero:`` it neither hangs nor raises. Outside the
hook, every value is stock's (tests/sync/test_coalesced.py, tests/sync/test_readers.py). Each rank logs a value of its
own, so the two readings differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import coalesce_tasks, pending_read_tasks

TASK = "tests.helpers.coalesce_tasks:fit"
WORLD = 2


def program() -> dict[str, Any]:
    keys = [
        {
            "name": f"value_{how}",
            "reduce_fx": how,
            "on_step": True,
            "on_epoch": False,
            "prog_bar": False,
            "dtype": "float32",
            "values": [[[1.0 + 4 * rank + batch for batch in range(2)]] for rank in range(WORLD)],
            "batch_sizes": None,
        }
        for how in ("mean", "max")
    ]
    return {"epochs": 1, "batches": 2, "training_step": keys, **{hook: [] for hook in _OTHER_HOOKS}}


_OTHER_HOOKS = ("on_train_batch_end", "callback_on_train_batch_end", "validation_step")


def _first_line(key: str, site: str, rank: int, hook: str, stock: str) -> str:
    return (
        f"{key!r} read at {site} is rank {rank}'s own value: it syncs when {hook} returns, and stock Lightning gives"
        f' {stock} over every rank here. Read it after {hook} returns, or pass log_sync="per_value".'
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_read_right_after_self_log_is_this_ranks_value_and_warns_once_naming_the_key_the_line_and_the_fix(
    rank_pools: Any, tmp_path: Path
) -> None:
    pool = rank_pools(WORLD)
    stock = pool.run(TASK, (str(tmp_path / "stock"), program(), True), timeout=120)
    ours = pool.run(TASK, (str(tmp_path / "ours"), program(), False), timeout=120)
    per_value = pool.run(TASK, (str(tmp_path / "per_value"), program(), False, {"log_sync": "per_value"}), timeout=120)
    path = coalesce_tasks.__file__
    line = next(n for n, text in enumerate(Path(path).read_text().splitlines(), 1) if "seen[key[" in text)
    for rank in range(WORLD):
        own = [{"value_mean": 1.0 + 4 * rank + batch, "value_max": 1.0 + 4 * rank + batch} for batch in range(2)]
        synced = [{"value_mean": 3.0 + batch, "value_max": 5.0 + batch} for batch in range(2)]
        assert ours[rank]["read_inside"] == own, ours[rank]["read_inside"]
        assert stock[rank]["read_inside"] == synced, stock[rank]["read_inside"]
        assert per_value[rank]["read_inside"] == synced
        # one warning for the line (it reads both keys at both steps), at that line, naming the first key read
        first = _first_line("value_mean", f"{path}:{line} in log_keys", rank, "training_step", "the mean")
        assert ours[rank]["unsynced_reads"] == [(first, path, line)], ours[rank]["unsynced_reads"]
        assert stock[rank]["unsynced_reads"] == per_value[rank]["unsynced_reads"] == []
        # and once the hook returned, what a callback reads is stock's
        assert ours[rank]["callback_reads"] == stock[rank]["callback_reads"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_read_under_a_rank_guard_makes_no_collective_it_warns_on_that_rank_only(rank_pools: Any) -> None:
    pool = rank_pools(WORLD)
    stock = pool.run("tests.helpers.pending_read_tasks:guarded_read", (True,), timeout=120)
    ours = pool.run("tests.helpers.pending_read_tasks:guarded_read", (False,), timeout=120)  # no hang, no error
    path, line = pending_read_tasks.__file__, pending_read_tasks.line_of("# the guarded read")
    first = _first_line("g", f"{path}:{line} in training_step", 0, "training_step", "the mean")
    assert ours[0]["warnings"] == [(first, path, line)]
    assert ours[1]["warnings"] == [] and ours[1]["inside"] == []
    assert ours[0]["inside"] == [0.0, 1.0, 2.0]  # rank 0's own value, as the warning said
    assert stock[0]["inside"] == [0.5, 1.5, 2.5]
    for rank in range(WORLD):
        assert ours[rank]["after"] == stock[rank]["after"], (ours[rank]["after"], stock[rank]["after"])
