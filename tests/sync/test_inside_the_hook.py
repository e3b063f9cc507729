"""What a read inside the logging hook, right after ``self.log``, sees (docs/synced-logging.md).

Under the coalesced sync, ``trainer.callback_metrics[key]`` holds this rank's own value until the hook returns; stock
(and ``log_sync="per_value"``) hold the synced value there. Outside the hook, every value is stock's
(tests/sync/test_coalesced.py). Each rank logs a value of its own, so the two readings differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_read_right_after_self_log_sees_this_ranks_value_until_the_hook_returns(
    rank_pools: Any, tmp_path: Path
) -> None:
    pool = rank_pools(WORLD)
    stock = pool.run(TASK, (str(tmp_path / "stock"), program(), True), timeout=120)
    ours = pool.run(TASK, (str(tmp_path / "ours"), program(), False), timeout=120)
    per_value = pool.run(TASK, (str(tmp_path / "per_value"), program(), False, {"log_sync": "per_value"}), timeout=120)
    for rank in range(WORLD):
        own = [{"value_mean": 1.0 + 4 * rank + batch, "value_max": 1.0 + 4 * rank + batch} for batch in range(2)]
        synced = [{"value_mean": 3.0 + batch, "value_max": 5.0 + batch} for batch in range(2)]
        assert ours[rank]["read_inside"] == own, ours[rank]["read_inside"]
        assert stock[rank]["read_inside"] == synced, stock[rank]["read_inside"]
        assert per_value[rank]["read_inside"] == synced
        # and once the hook returned, what a callback reads is stock's
        assert ours[rank]["callback_reads"] == stock[rank]["callback_reads"]
