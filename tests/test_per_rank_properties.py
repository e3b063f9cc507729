"""Property test: random per-rank logging scripts through real ``Trainer.fit`` runs in the persistent rank pools.

Each per-rank file must equal the reference local reduction of that rank's values; rank 0's synced ``metrics.csv``
must equal the reference global reduction; and the reader must return exactly what is in the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_ext import read_rank_metrics
from tests._metrics_reference import _forked, expected_cells, observed_cells

pytestmark = pytest.mark.slow
DYADIC = st.integers(-32, 32).map(lambda n: n / 4)
EXAMPLES = max(6, settings().max_examples // 10)  # each example is a real Trainer.fit: a tenth of the profile


@st.composite
def scripts(draw: st.DrawFn) -> tuple[int, int, int, dict[str, list[dict[str, Any]]]]:
    world = draw(st.integers(2, 3))
    epochs, batches = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    entries = []
    for index in range(draw(st.integers(1, 4))):
        on_step, on_epoch = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
        options = {
            "on_step": on_step,
            "on_epoch": on_epoch,
            "reduce_fx": draw(st.sampled_from(["mean", "sum", "min", "max"])) if on_epoch else "mean",
            "sync_dist": draw(st.booleans()),
        }
        if on_epoch and not on_step and draw(st.integers(0, 5)) == 0:
            options["rank_zero_only"] = True
        shared_sizes = [[draw(st.integers(1, 4)) for _ in range(batches)] for _ in range(epochs)]
        sized = options["reduce_fx"] == "mean" and draw(st.booleans())
        entries.append(
            {
                "name": f"m{index}",
                "options": options,
                "values": [[[draw(DYADIC) for _ in range(batches)] for _ in range(epochs)] for _ in range(world)],
                # equal on every rank: Lightning's own synced weighted mean is wrong otherwise (upstream)
                "batch_sizes": [shared_sizes] * world if sized else None,
            }
        )
    return world, epochs, batches, {"train": entries}


@settings(max_examples=EXAMPLES)
@given(scripts())
def test_property_per_rank_files_hold_the_local_reductions(rank_pools: Any, tmp_path_factory: Any, case: Any) -> None:
    world, epochs, batches, script = case
    root = tmp_path_factory.mktemp("run")
    results = rank_pools(world).run(
        "tests.logging_scenarios:fit",
        (str(root), script),
        epochs=epochs,
        batches=batches,
        val_dataloaders=0,
        timeout=120,
    )
    log_dir = Path(results[0]["log_dir"])
    step_columns = {_forked(e, True) for e in script["train"] if e["options"]["on_step"]}
    epoch_columns = {_forked(e, False) for e in script["train"] if e["options"]["on_epoch"]}
    expected = expected_cells(script, world, epochs, batches)
    stock = pd.read_csv(log_dir / "metrics.csv")
    assert observed_cells(stock, batches, step_columns, epoch_columns) == expected["synced"]
    table = read_rank_metrics(log_dir)
    for rank in range(world):
        raw = pd.read_csv(log_dir / f"rank_{rank}" / "metrics.csv")
        mine = table[table["rank"] == rank].drop(columns=["rank"]).dropna(axis=1, how="all").reset_index(drop=True)
        # the reader returns exactly the file's rows and numbers
        pd.testing.assert_frame_equal(mine[sorted(raw.columns)], raw[sorted(raw.columns)], check_dtype=False)
        assert observed_cells(raw, batches, step_columns, epoch_columns) == expected[rank], f"rank {rank}"
