"""The summary and the plot at scale: each rank's value, the robust z-score, the furthest ranks, bands and heatmap.

References are computed here with NumPy from the documented formulas, never with lightning_ext.
"""

import math

import numpy as np
import pandas as pd
import pytest

from lightning_ext._summaries import heatmap
from lightning_ext._summaries import plots as _rank_plots
from lightning_ext.rank_spread import rank_values, robust_z, summarize_ranks

RANKS = 40


def long_table(ranks: int = RANKS, steps: int = 30, seed: int = 0) -> pd.DataFrame:
    """Noise around 1.0; rank 7 drifts up from step 10 on; rank 13 stops at step 14; ``lr`` equal everywhere but
    rank 21 (MAD 0); ``acc`` only every 10 steps."""
    rng = np.random.default_rng(seed)
    rows = []
    for rank in range(ranks):
        for step in range(steps if rank != 13 else 15):
            loss = 1.0 + 0.01 * rng.standard_normal() + (0.5 * (step - 9) if rank == 7 and step >= 10 else 0.0)
            row = {"rank": rank, "step": step, "loss": loss, "lr": 0.5 if rank == 21 else 0.1}
            row["acc"] = 0.5 + 0.01 * rng.standard_normal() if step % 10 == 9 else np.nan
            rows.append(row)
    return pd.DataFrame(rows)


def test_rank_values_are_each_ranks_last_value_or_its_value_at_a_step():
    table = long_table()
    values, steps = rank_values(table, metrics=["loss", "acc"])
    for rank in (0, 7, 13):
        mine = table[table["rank"] == rank]
        assert values.loc[rank, "loss"] == mine["loss"].iloc[-1] and steps.loc[rank, "loss"] == mine["step"].iloc[-1]
        present = mine.dropna(subset=["acc"])
        assert values.loc[rank, "acc"] == present["acc"].iloc[-1] and steps.loc[rank, "acc"] == present["step"].iloc[-1]
    at_five, _ = rank_values(table, step=5)
    assert at_five["loss"].tolist() == table[table["step"] == 5]["loss"].tolist()
    assert at_five["acc"].isna().all()  # nobody logged acc at step 5
    at_twenty, _ = rank_values(table, step=20)
    assert math.isnan(at_twenty.loc[13, "loss"]) and at_twenty["loss"].notna().sum() == RANKS - 1
    with pytest.raises(ValueError, match="step must be 'last' or an int, got 'first'"):
        rank_values(table, step="first")  # type: ignore[arg-type]


def reference_z(values: np.ndarray) -> tuple[np.ndarray, str]:
    """The documented rule, written out again."""
    median = np.median(values)
    deviation = values - median
    mad = np.median(np.abs(deviation))
    if mad > 0:
        return 0.6745 * deviation / mad, "MAD"
    mean_ad = np.mean(np.abs(deviation))
    if mean_ad > 0:
        return 0.7979 * deviation / mean_ad, "mean absolute deviation"
    return np.zeros_like(values), "none"


@pytest.mark.parametrize(
    "values",
    [
        [1.0, 1.1, 0.9, 1.0, 9.0, 1.05, 0.95],
        [2.0, 2.0, 2.0, 2.0, 2.0, 3.0],  # MAD 0: the mean absolute deviation
        [5.0, 5.0, 5.0],  # all equal: nobody is away
        list(np.random.default_rng(3).standard_normal(501)),
    ],
)
def test_robust_z_follows_the_documented_rule(values):
    z, scale = robust_z(pd.Series(values))
    expected, expected_scale = reference_z(np.array(values))
    assert scale == expected_scale
    np.testing.assert_allclose(z.to_numpy(), expected, rtol=1e-12, atol=1e-12)


def test_robust_z_is_not_fooled_by_one_wild_value():
    """A classic z-score hides a second outlier behind the first; the robust one does not."""
    values = np.array([1.0] * 20 + [1.5, 1000.0]) + np.linspace(0, 0.01, 22)
    classic = (values - values.mean()) / values.std()
    robust, _ = robust_z(pd.Series(values))
    assert abs(classic[20]) < 1  # 1.5 looks ordinary next to 1000
    assert robust[20] > 3.5 and robust[21] > robust[20]


def test_robust_z_with_missing_and_infinite_values():
    """NaN is left out; infinities count for the median but not for the scale, and are infinitely far."""
    z, scale = robust_z(pd.Series([1.0, 1.2, np.nan, 0.8, np.inf, 1.1, -np.inf]))
    assert math.isnan(z[2]) and z[4] == np.inf and z[6] == -np.inf and scale == "MAD"
    median = 1.05  # of 1.0, 1.2, 0.8, inf, 1.1, -inf
    mad = np.median(np.abs(np.array([1.0, 1.2, 0.8, 1.1]) - median))  # 0.1
    assert z[[0, 1, 3, 5]].tolist() == pytest.approx([0.6745 * (x - median) / mad for x in (1.0, 1.2, 0.8, 1.1)])


def test_summary_names_the_ranks_furthest_from_the_median():
    table = long_table()
    spreads = {spread.metric: spread for spread in summarize_ranks(table, top=3)}
    last = table.groupby("rank")["loss"].last().to_numpy()
    loss = spreads["loss"]
    assert (loss.ranks, loss.missing) == (RANKS, ())
    assert (loss.min, loss.median, loss.max) == (last.min(), np.median(last), last.max())
    assert loss.spread == last.max() - last.min() and loss.mad == np.median(np.abs(last - np.median(last)))
    expected, _ = reference_z(last)
    order = np.argsort(-np.abs(expected), kind="stable")[:3]
    assert [far.rank for far in loss.furthest] == order.tolist()
    assert loss.furthest[0].rank == 7  # the drifting rank
    assert [far.robust_z for far in loss.furthest] == pytest.approx(expected[order].tolist())
    assert loss.furthest[0].step == 29
    lr = spreads["lr"]
    assert lr.scale == "mean absolute deviation" and [far.rank for far in lr.furthest] == [21]
    assert lr.furthest[0].robust_z == pytest.approx(0.7979 * 0.4 / (0.4 / RANKS))
    assert summarize_ranks(table, top=0)[0].furthest == ()
    with pytest.raises(ValueError, match="top must be a whole number >= 0, got -1"):
        summarize_ranks(table, top=-1)


def test_the_summary_does_not_grow_with_the_ranks():
    small, large = summarize_ranks(long_table(ranks=40)), summarize_ranks(long_table(ranks=400))
    assert [len(spread.furthest) for spread in small] == [len(spread.furthest) for spread in large] == [5, 5, 1]


def test_the_plot_draws_bands_the_outlier_rank_and_a_heatmap_with_the_straggler_in_grey():
    figure = _rank_plots.draw(long_table(), metrics=["loss"], top=3)
    curves, heatmap = figure.axes[0], figure.axes[1]
    labels = [text.get_text() for text in curves.get_legend().get_texts()]
    assert labels[:3] == ["5-95th percentile", "25-75th", "median"]
    assert len(labels) == 4 and labels[3].startswith("rank 7 (mean |z| ")  # the only rank beyond the usual spread
    image = heatmap.get_images()[0].get_array()
    assert image.shape == (RANKS, 30)  # one row per rank, one column per step: nothing pooled
    assert image.mask[13, 15:].all() and not image.mask[13, :15].any()  # rank 13 stopped at step 14
    assert (image[7, 12:] >= 5).all()  # rank 7's drift, in the darkest reds


def test_the_heatmap_pools_many_ranks_without_losing_one(monkeypatch):
    monkeypatch.setattr(heatmap, "HEATMAP_ROWS", 8)
    monkeypatch.setattr(heatmap, "HEATMAP_COLUMNS", 10)
    figure = _rank_plots.draw(long_table(), metrics=["loss"])
    image = figure.axes[1].get_images()[0].get_array()
    assert image.shape == (8, 10)  # 5 ranks x 3 steps per cell
    assert image.mask[2, 5:].all() and not image.mask[2, :5].any()  # the cell of ranks 10-14 holds rank 13
    assert (image[1, 4:] >= 5).all()  # the cell of ranks 5-9 holds rank 7's drift
    assert "a cell: 5 ranks x 3 steps" in figure.axes[1].get_title()


def test_few_ranks_get_a_line_each():
    figure = _rank_plots.draw(long_table(ranks=4), metrics=["loss", "acc"])
    assert [text.get_text() for text in figure.axes[0].get_legend().get_texts()] == [f"rank {r}" for r in range(4)]
    assert figure.axes[2].get_title().startswith("acc: each rank")


def test_the_time_heatmap_pools_as_the_metrics_one_the_slowest_rank_and_a_stopped_one_show():
    times = np.full((6, 4), 0.01)
    times[4, :] = 0.5  # rank 4 is slow all along
    times[1, 2:] = np.nan  # rank 1 has no rows after step 1
    cells = heatmap.pooled(times, 3, 2)
    assert cells.shape == (2, 2)
    assert cells[1, 0] == cells[1, 1] == pytest.approx(0.5)  # the cell of ranks 3-5 shows the slow rank
    assert cells[0, 0] == pytest.approx(0.01) and np.isnan(cells[0, 1])  # rank 1's stop shows


def test_every_summary_writes_nan_as_an_empty_csv_cell_and_infinity_as_inf():
    from lightning_ext._summaries.spread import MetricSpread, RankValue
    from lightning_ext._summaries.spread_format import spreads_csv
    from lightning_ext._summaries.straggler_format import stragglers_csv

    spread = MetricSpread(
        "loss", 2, (), math.nan, 1.0, math.inf, math.nan, 0.0, "MAD", (RankValue(1, math.inf, 3, math.nan),)
    )
    assert spreads_csv([spread], top=1).splitlines()[1] == "loss,2,,,1.0,inf,,0.0,MAD,1,inf,3,"
    found = pd.DataFrame(
        [
            {
                "rank": 1,
                "phase": "forward",
                "pattern": "bursts",
                "cost": math.nan,
                "waited_s": 0.5,
                "excess_s": math.inf,
                "seconds": 0.25,
                "others_s": -math.inf,
                "held": 2,
                "rows": 4,
                "spans": ((3, 3), (5, 7)),
            }
        ]
    )
    hosts = pd.DataFrame({"host": ["node0"]}, index=[0])  # rank 1's host unknown: an empty cell too
    assert stragglers_csv(found, hosts).splitlines()[1] == '1,,forward,bursts,,0.5,inf,0.25,-inf,2,4,"3, 5-7"'
