"""Property test: random per-rank logging scripts through real ``Trainer.fit`` runs in the persistent rank pools.

Each script logs, at world sizes 1-4, tensors and ``torchmetrics`` metrics with random ``reduce_fx``, sync flags,
step/epoch options, per-rank batch sizes that differ between ranks, and values that include NaN and ±inf; in training
and in validation with one or two dataloaders (``/dataloader_idx_N`` suffixes). Each per-rank file must equal the
reference local reduction of that rank's values (read from the file itself, so a logged NaN is told apart from a
missing cell); rank 0's synced ``metrics.csv`` must equal the reference global reduction (which judges the reference
against stock Lightning); and the reader must return exactly what is in the files.

Each example is a real ``Trainer.fit``: each world size runs :data:`tests.helpers.search.PER_SUITE_FIT` examples
(scaled by the Hypothesis profile).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_ext import read_rank_metrics
from tests.helpers.metrics_reference import comparable, expected_cells, file_cells, forked
from tests.helpers.search import PER_SUITE_FIT, examples

pytestmark = pytest.mark.slow
DYADIC = st.integers(-32, 32).map(lambda n: n / 4)
VALUES = st.one_of(DYADIC, DYADIC, DYADIC, st.sampled_from([math.nan, math.inf, -math.inf]))


def _entry(draw: st.DrawFn, name: str, world: int, epochs: int, batches: int, stage: str) -> dict[str, Any]:
    torchmetric = draw(st.integers(0, 4)) == 0
    if stage == "val" or torchmetric:
        on_step, on_epoch = False, True
    else:
        on_step, on_epoch = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
    options: dict[str, Any] = {"on_step": on_step, "on_epoch": on_epoch, "sync_dist": draw(st.booleans())}
    if not torchmetric:
        options["reduce_fx"] = draw(st.sampled_from(["mean", "mean", "sum", "min", "max"])) if on_epoch else "mean"
        if on_epoch and not on_step and draw(st.integers(0, 5)) == 0:
            options["rank_zero_only"] = True
    sized = options.get("reduce_fx", "mean") == "mean" and draw(st.integers(0, 3)) > 0
    sizes = st.integers(1, 4)
    return {
        "name": name,
        "kind": "torchmetric" if torchmetric else "tensor",
        "options": options,
        "values": [[[draw(VALUES) for _ in range(batches)] for _ in range(epochs)] for _ in range(world)],
        # each rank its own batch sizes: Lightning's synced weighted mean truncates the count then (upstream), and
        # the reference mirrors that; each rank's file must hold its own correct value
        "batch_sizes": [[[draw(sizes) for _ in range(batches)] for _ in range(epochs)] for _ in range(world)]
        if sized
        else None,
    }


@st.composite
def scripts(draw: st.DrawFn, world: int) -> tuple[int, int, int, dict[str, list[dict[str, Any]]]]:
    epochs, batches = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    train = [_entry(draw, f"m{i}", world, epochs, batches, "train") for i in range(draw(st.integers(1, 3)))]
    loaders = draw(st.integers(0, 2))
    val = []
    for index in range(draw(st.integers(1, 3)) if loaders else 0):
        entry = _entry(draw, f"v{index}", world, epochs, batches, "val")
        val.append(dict(entry, dataloader_idx=draw(st.integers(0, loaders - 1)), dataloaders=loaders))
    script = {"train": train, "val": val} if val else {"train": train}
    return loaders, epochs, batches, script


def _check_run(rank_pools: Any, root: Path, world: int, case: Any) -> None:
    loaders, epochs, batches, script = case
    results = rank_pools(world).run(
        "tests.helpers.logging_scenarios:fit",
        (str(root), script),
        epochs=epochs,
        batches=batches,
        val_dataloaders=loaders,
        timeout=180,
    )
    log_dir = Path(results[0]["log_dir"])
    step_columns = {forked(e, True) for e in script["train"] if e["options"]["on_step"]}
    epoch_columns = {forked(e, False) for e in script["train"] if e["options"]["on_epoch"]}
    expected = expected_cells(script, world, epochs, batches)

    def check(path: Path, want: dict[Any, Any], who: str) -> None:
        got = file_cells(path, batches, step_columns, epoch_columns)
        assert comparable(got, want) == comparable(want, want), f"{who}: {path}"

    check(log_dir / "metrics.csv", expected["synced"], "rank 0's synced metrics.csv (the reference against stock)")
    table = read_rank_metrics(log_dir)
    assert sorted(table["rank"].unique()) == list(range(world))
    for rank in range(world):
        path = log_dir / f"rank_{rank}" / "metrics.csv"
        check(path, expected[rank], f"rank {rank}")
        raw = pd.read_csv(path)
        mine = table[table["rank"] == rank].drop(columns=["rank"]).reset_index(drop=True)
        # the reader returns exactly the file's rows and numbers (a logged NaN and a missing cell both read as NaN),
        # and nothing in the columns of metrics that only other ranks logged
        others = [column for column in mine.columns if column not in raw.columns]
        assert mine[others].isna().all().all(), f"rank {rank}: values in {others}"
        pd.testing.assert_frame_equal(mine[sorted(raw.columns)], raw[sorted(raw.columns)], check_dtype=False)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_property_per_rank_files_hold_each_rank_s_local_reductions(
    rank_pools: Any, tmp_path_factory: Any, world: int
) -> None:
    @settings(max_examples=examples(PER_SUITE_FIT))
    @given(scripts(world))
    def run(case: Any) -> None:
        _check_run(rank_pools, tmp_path_factory.mktemp(f"w{world}_"), world, case)

    run()
