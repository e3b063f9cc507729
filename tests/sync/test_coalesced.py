"""The coalesced sync gives every value that users see outside the logging hook as stock Lightning gives it.

Random logging programs (1-12 keys per hook; mean, sum, max, min; ``on_step``/``on_epoch`` mixes; int, float32 and
float64 values with NaN and inf; uneven batch sizes; in ``training_step``, the module's and a callback's
``on_train_batch_end`` and ``validation_step``) run on the same rank pool under a **stock** ``DDPStrategy`` and under
``PolicyDDPStrategy()`` (coalesced, the default). Compared on every rank: ``callback_metrics``, ``logged_metrics``,
``progress_bar_metrics``, what a callback reads in ``on_train_batch_end`` before the logging callback in the list
(after the module logged in ``training_step``) and what one reads after it (the logging callback's values of that
same hook too), and rank 0's ``metrics.csv``.

The tolerance (docs/synced-logging.md, "Float tolerance"): max and min exactly; sum and mean exactly at one or two
ranks; at three or more, packed values are summed in another order than stock's lone all-reduce sums them, so a float
sum may differ in its last bits: here by at most ``8 * W * eps * S``, where ``S`` bounds the sum of the absolute values
summed (the docs state ``2 (W - 1) eps S``). A synced epoch
mean whose ranks' batch-size totals differ is compared with the exact weighted mean instead: stock truncates its
batch count there (Lightning #21859; tests/strategies/test_synced_means.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import search
from tests.helpers.coalesce_tasks import HOOKS

_EPS = {"int": 2.0**-23, "float32": 2.0**-23, "float64": 2.0**-52}
SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf])


@st.composite
def programs(draw: st.DrawFn, world: int) -> dict[str, Any]:
    epochs, batches = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    program: dict[str, Any] = {"epochs": epochs, "batches": batches}
    for hook in HOOKS:
        keys = []
        for index in range(draw(st.integers(1 if hook == "training_step" else 0, 12))):
            reduce_fx = draw(st.sampled_from(["mean", "sum", "max", "min"]))
            on_step, on_epoch = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
            dtype = draw(st.sampled_from(["int", "float32", "float64"]))
            if dtype == "int":
                value = st.integers(-1000, 1000)
            else:
                finite = st.floats(-1e6, 1e6, width=32 if dtype == "float32" else 64)
                value = finite | SPECIAL if draw(st.integers(0, 9)) == 0 else finite
            sized = reduce_fx == "mean" and on_epoch and draw(st.booleans())
            keys.append(
                {
                    "name": f"{hook}_{index}",
                    "reduce_fx": reduce_fx,
                    "on_step": on_step,
                    "on_epoch": on_epoch,
                    "prog_bar": draw(st.booleans()),
                    "dtype": dtype,
                    "values": [[[draw(value) for _ in range(batches)] for _ in range(epochs)] for _ in range(world)],
                    "batch_sizes": sizes(draw, world, epochs, batches) if sized else None,
                }
            )
        program[hook] = keys
    return program


def sizes(draw: st.DrawFn, world: int, epochs: int, batches: int) -> list[list[list[int]]]:
    """Every rank's batch size at each (epoch, batch): uneven across ranks and batches."""
    return [[[draw(st.integers(1, 7)) for _ in range(batches)] for _ in range(epochs)] for _ in range(world)]


def _keys(program: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {key["name"]: key for hook in HOOKS for key in program[hook]}


def _key_of(column: str, keys: dict[str, dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """The program key behind a logged name (``x``, ``x_step``, ``x_epoch``), and which value it is."""
    for suffix, phase in (("_step", "step"), ("_epoch", "epoch")):
        if column.endswith(suffix) and column[: -len(suffix)] in keys:
            return keys[column[: -len(suffix)]], phase
    key = keys.get(column)
    if key is None:
        return None, ""
    return key, "step" if key["on_step"] and not key["on_epoch"] else "epoch"


def _uneven_totals(key: dict[str, Any], epoch: int) -> bool:
    """Whether the ranks' batch-size totals differ in ``epoch`` (where stock's synced mean is wrong)."""
    sizes = key["batch_sizes"]
    return sizes is not None and len({sum(rank[epoch]) for rank in sizes}) > 1


def _magnitude(key: dict[str, Any]) -> float:
    """The sum of the absolute values the backend sums for this key (its largest over epochs), for the tolerance."""
    finite = [abs(v) for rank in key["values"] for epoch in rank for v in epoch if math.isfinite(v)]
    weight = max((n for rank in key["batch_sizes"] or [] for epoch in rank for n in epoch), default=1)
    return max(finite, default=0.0) * weight * len(key["values"]) * len(key["values"][0][0])


def same(ours: float, stock: float, key: dict[str, Any] | None, world: int) -> bool:
    if ours == stock or (math.isnan(ours) and math.isnan(stock)):
        return True
    if key is None or world <= 2 or key["reduce_fx"] in ("max", "min") or not math.isfinite(stock):
        return False
    return abs(ours - stock) <= 8 * world * _EPS[key["dtype"]] * _magnitude(key)


def exact_epoch_mean(key: dict[str, Any], epoch: int) -> float:
    """The weighted mean over every rank and batch of one epoch, in float64 (the reference where stock is wrong)."""
    ranks = zip(key["values"], key["batch_sizes"], strict=True)
    pairs = [(v, n) for values, counts in ranks for v, n in zip(values[epoch], counts[epoch], strict=True)]
    return sum(v * n for v, n in pairs) / sum(n for _, n in pairs)


def _has_nan(key: dict[str, Any]) -> bool:
    return any(math.isnan(v) for rank in key["values"] for epoch in rank for v in epoch)


def compare(name: str, ours: float, stock: float, keys: dict[str, Any], world: int, epoch: int, where: str) -> None:
    """Compare one visible value with stock's; ``epoch``: the epoch an epoch value shown there was computed in.

    Where stock is wrong, the value must be right instead: a synced epoch mean whose ranks' batch-size totals differ
    is the exact weighted mean; a max or min of values of which one is NaN is NaN (as ``torch.max``/``min``; gloo
    keeps or drops a NaN depending on the rank it came from).
    """
    key, _ = _key_of(name, keys)
    if same(ours, stock, key, world) or key is None:
        assert same(ours, stock, key, world), (where, name, ours, stock)
        return
    if key["reduce_fx"] == "mean" and epoch >= 0 and _uneven_totals(key, epoch):
        reference = exact_epoch_mean(key, epoch)
        assert math.isclose(ours, reference, rel_tol=1e-5, abs_tol=1e-5), (where, name, ours, stock, reference)
        return
    if key["reduce_fx"] in ("max", "min") and math.isnan(ours) and _has_nan(key):
        return
    raise AssertionError((where, name, ours, stock))


def compare_dicts(
    ours: dict[str, float], stock: dict[str, float], keys: dict, world: int, epoch: int, where: str
) -> None:
    assert set(ours) == set(stock), (where, sorted(set(ours) ^ set(stock)))
    for name in stock:
        compare(name, ours[name], stock[name], keys, world, epoch, where)


def _cells(rows: list[dict[str, str]]) -> Iterator[tuple[int, str, str]]:
    for index, row in enumerate(rows):
        for column, cell in row.items():
            yield index, column, cell


def check_same_as_stock(program: dict[str, Any], ours: list[dict], stock: list[dict], world: int) -> None:
    keys, last = _keys(program), program["epochs"] - 1
    for rank, (mine, theirs) in enumerate(zip(ours, stock)):
        for what in ("callback_metrics", "logged_metrics", "progress_bar_metrics"):
            compare_dicts(mine[what], theirs[what], keys, world, last, f"rank {rank} {what}")
        for reader in ("callback_reads", "callback_reads_after"):
            assert len(mine[reader]) == len(theirs[reader])
            for batch, (read, reference) in enumerate(zip(mine[reader], theirs[reader])):
                shown = batch // program["batches"] - 1  # the epoch values shown during an epoch are the last epoch's
                compare_dicts(read, reference, keys, world, shown, f"rank {rank} {reader} at batch {batch}")
    mine_rows, their_rows = ours[0]["csv"], stock[0]["csv"]
    assert len(mine_rows) == len(their_rows)
    assert [set(row) for row in mine_rows] == [set(row) for row in their_rows]
    for (index, column, cell), (_, _, reference) in zip(_cells(mine_rows), _cells(their_rows)):
        if cell == reference:
            continue
        assert cell and reference, ("metrics.csv", index, column, cell, reference)
        epoch = int(float(their_rows[index]["epoch"])) if their_rows[index].get("epoch") else 0
        compare(column, float(cell), float(reference), keys, world, epoch, f"metrics.csv row {index}")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_property_every_visible_value_is_stocks(rank_pools: Any, tmp_path: Path, world: int) -> None:
    runs = iter(range(10**6))

    @settings(max_examples=search.examples(search.PER_SUITE_FIT))
    @given(program=programs(world))
    def check(program: dict[str, Any]) -> None:
        run = next(runs)
        pool = rank_pools(world)
        stock = pool.run(
            "tests.helpers.coalesce_tasks:fit", (str(tmp_path / f"stock{run}"), program, True), timeout=120
        )
        ours = pool.run("tests.helpers.coalesce_tasks:fit", (str(tmp_path / f"ours{run}"), program, False), timeout=120)
        check_same_as_stock(program, ours, stock, world)

    check()
