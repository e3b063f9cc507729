"""The straggler verdict and the per-host memory check against an independent reference, and as the command prints."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_ext._summaries import stragglers as rule
from lightning_ext._summaries.stragglers import rank_times, verdict
from lightning_ext.cli import main
from lightning_ext.rank_metrics import RankMetricsWriter, rank_metrics_path
from lightning_ext.rank_spread import find_stragglers, host_memory
from tests.helpers.straggler_reference import host_peaks, stragglers

TIMES = ["telemetry/data_wait_s", "telemetry/forward_s", "telemetry/backward_s", "telemetry/optimizer_s",
         "telemetry/collectives_s", "telemetry/gradient_wait_s"]  # fmt: skip
# whole multiples of 1/1024 s: sums and differences are exact, so neither side's order of addition decides a tie
seconds = st.integers(0, 40).map(lambda units: units / 1024)


@st.composite
def telemetry_tables(draw: st.DrawFn) -> tuple[pd.DataFrame, dict[int, list[dict[str, float]]]]:
    """Up to 12 ranks' rows at steps 0-7, some missing; each row's step is its phases plus a little."""
    world = draw(st.integers(1, 12))
    samples: dict[int, list[dict[str, float]]] = {}
    rows = []
    for rank in range(world):
        samples[rank] = []
        for step in draw(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True).map(sorted)):
            row = {column: draw(seconds) for column in TIMES}
            row["telemetry/step_s"] = sum(row.values()) + draw(seconds)
            samples[rank].append({"step": step, **row})
            rows.append({"rank": rank, "step": step, **row})
    return pd.DataFrame(rows), samples


@given(telemetry_tables())
def test_the_verdict_is_the_reference_rule(case: tuple[pd.DataFrame, dict[int, list[dict[str, float]]]]) -> None:
    table, samples = case
    found = find_stragglers(table)
    expected = stragglers(samples)
    assert sorted(found["rank"]) == sorted(expected)
    for record in found.itertuples():
        reference = expected[record.rank]
        assert (record.phase, record.pattern, record.held, record.rows) == (
            reference.phase, reference.pattern, reference.held, reference.rows
        )  # fmt: skip
        assert list(record.spans) == reference.spans and record.cost == pytest.approx(reference.cost)
    assert list(found["cost"]) == sorted(found["cost"], reverse=True)


@given(telemetry_tables())
def test_rank_0s_live_check_of_the_same_rows_is_the_reference_rule(
    case: tuple[pd.DataFrame, dict[int, list[dict[str, float]]]],
) -> None:
    """The live check's path (no pandas): each rank's window as its watchdog answers it, the warm-up row left out."""
    _, samples = case
    windows = {rank: [(int(row["step"]), {k: v for k, v in row.items() if k != "step"}) for row in rows[1:]]
               for rank, rows in samples.items()}  # fmt: skip
    found = rule.stragglers(rule.window_times(windows))
    expected = stragglers(samples)
    assert sorted(record.rank for record in found) == sorted(expected)
    for record in found:
        reference = expected[record.rank]
        assert (record.phase, record.pattern, record.held, record.rows) == (
            reference.phase, reference.pattern, reference.held, reference.rows
        )  # fmt: skip
        assert list(record.spans) == reference.spans and record.cost == pytest.approx(reference.cost)
    assert [record.cost for record in found] == sorted((record.cost for record in found), reverse=True)


def _row(rank: int, step: int, *, data: float = 0.001, backward: float = 0.004, wait: float = 0.0) -> dict[str, float]:
    """A row whose phases are as given, whose wait is in the gradient all-reduce, with 1 ms of hooks and logging."""
    own = {"telemetry/data_wait_s": data, "telemetry/forward_s": 0.004, "telemetry/backward_s": backward,
           "telemetry/optimizer_s": 0.001, "telemetry/collectives_s": 0.0005,
           "telemetry/gradient_wait_s": wait}  # fmt: skip
    return {"rank": rank, "step": step, "telemetry/step_s": sum(own.values()) + 0.001, **own}


def test_two_ranks_one_waiting_for_the_other_in_every_row_is_a_chronic_straggler() -> None:
    rows = [_row(0, step, wait=0.040) for step in range(10)] + [_row(1, step, data=0.041) for step in range(10)]
    found = find_stragglers(pd.DataFrame(rows))
    assert found[["rank", "phase", "pattern", "held", "rows"]].values.tolist() == [[1, "data loading", "chronic", 9, 9]]
    assert found.at[0, "spans"] == ((1, 9),)  # the first row, the warm-up, is left out
    assert found.at[0, "excess_s"] == pytest.approx(0.04) and found.at[0, "waited_s"] == pytest.approx(0.04)
    assert (found.at[0, "seconds"], found.at[0, "others_s"]) == (pytest.approx(0.041), pytest.approx(0.001))
    assert found.at[0, "cost"] == pytest.approx(0.04 / 0.0515)  # of the 51.5 ms step


def test_a_rank_that_holds_the_others_back_at_a_few_steps_is_a_straggler_in_bursts() -> None:
    slow = {12, 13, 30}  # rank 2's backward computation takes 30 ms longer at these steps; 4 ranks
    rows = [_row(rank, step, backward=0.034 if rank == 2 and step in slow else 0.004,
                 wait=0.03 if rank != 2 and step in slow else 0.0)
            for rank in range(4) for step in range(40)]  # fmt: skip
    found = find_stragglers(pd.DataFrame(rows))
    assert found[["rank", "phase", "pattern", "held", "rows"]].values.tolist() == [
        [2, "backward compute", "bursts", 3, 39]
    ]
    assert found.at[0, "spans"] == ((12, 13), (30, 30))
    assert found.at[0, "cost"] == pytest.approx(3 * 0.03 / (3 * 0.0415 + 36 * 0.0115))  # of the run's step time


def test_noise_that_every_rank_has_names_no_straggler() -> None:
    """Each rank waits a random few ms in each row (its share of 4 ranks on 2 cores): none is waited for more."""
    rng = np.random.default_rng(7)
    rows = [_row(rank, step, data=0.001 + rng.uniform(0, 0.004), wait=rng.uniform(0, 0.004))
            for rank in range(4) for step in range(200)]  # fmt: skip
    assert find_stragglers(pd.DataFrame(rows)).empty


def test_files_written_before_the_wait_was_measured_count_backward_as_waiting(tmp_path: Path, capsys: Any) -> None:
    """Their ``backward_s`` held the gradient all-reduce's wait: the verdict still finds a slow loader."""
    rows = [*(_row(0, step, backward=0.045) for step in range(6)), *(_row(1, step, data=0.041) for step in range(6))]
    old = [{key: value for key, value in row.items() if key != "telemetry/gradient_wait_s"} for row in rows]
    found = find_stragglers(pd.DataFrame(old))
    assert found[["rank", "phase", "pattern"]].values.tolist() == [[1, "data loading", "chronic"]]
    for rank in range(2):
        with RankMetricsWriter.for_rank(tmp_path, rank) as writer:
            writer.reserve("telemetry/")
            for row in old[rank * 6 : rank * 6 + 6]:
                writer.log_columns({key: row[key] for key in row if key.startswith("telemetry/")}, row["step"])
    assert main(["ranks", str(tmp_path), "--stragglers"]) == 0
    text = capsys.readouterr().out
    assert "these files predate the measure of the gradient all-reduce's wait" in text
    assert "chronic (5 of 5 rows)" in text


def test_one_rank_alone_is_no_straggler() -> None:
    assert find_stragglers(pd.DataFrame([_row(0, step) for step in range(5)])).empty


def test_without_telemetry_the_verdict_says_how_to_turn_it_on() -> None:
    with pytest.raises(ValueError, match=r"no telemetry \(turn it on with PerRankMetrics\(telemetry=True\)\)"):
        find_stragglers(pd.DataFrame({"rank": [0], "step": [0], "loss": [1.0]}))


memory_rows = st.lists(
    st.tuples(
        st.integers(0, 7),  # rank
        st.integers(0, 3),  # step
        st.sampled_from([1e9, 2e9, 4e9, 9e9]),  # rss
        st.sampled_from([0.0, 1e9, math.nan]),  # workers
        st.sampled_from([3e9, 1e10, 3e10]),  # host used
    ),
    min_size=1,
    max_size=30,
)


@given(memory_rows, st.lists(st.sampled_from(["a", "b", "c"]), min_size=8, max_size=8))
def test_the_host_memory_check_is_the_reference_rule(
    rows: list[tuple[int, int, float, float, float]], host_of: list[str]
) -> None:
    sizes = {"a": 1.6e10, "b": 3.2e10, "c": 6.4e10}
    hosts = pd.DataFrame(
        {"host": host_of, "host_memory_bytes": [sizes[name] for name in host_of]},
        index=pd.Index(range(8), name="rank"),
    )
    table = pd.DataFrame(
        rows,
        columns=["rank", "step", "telemetry/rss_bytes", "telemetry/workers_rss_bytes", "telemetry/host_used_bytes"],
    )
    found = host_memory(table, hosts)
    expected = host_peaks(rows, {rank: (host_of[rank], sizes[host_of[rank]]) for rank in range(8)})
    assert set(found["host"]) == set(expected)
    for record in found.itertuples():
        step, held, warn = expected[record.host]
        assert (record.step, record.held, record.warn) == (step, pytest.approx(held), warn)
        assert record.share == pytest.approx(held / sizes[record.host])
    assert found["share"].is_monotonic_decreasing


def _write_run(root: Path, ranks: int, hosts: int, stragglers_at: dict[int, str]) -> None:
    """``ranks`` rank files of 7 telemetry rows each, ``ranks // hosts`` ranks per host; slow ranks as given: 30 ms more
    per batch in their phase, which every other rank waits for in the gradient all-reduce.

    Written as plain CSV text (fast at 1,024 ranks); the reader reads any file in the format.
    """
    rng = np.random.default_rng(1)
    phases = {"data loading": "telemetry/data_wait_s", "forward": "telemetry/forward_s"}
    memory = ["telemetry/host_used_bytes", "telemetry/rss_bytes", "telemetry/workers_rss_bytes"]
    header = ",".join(["epoch", "step", *TIMES, *memory, "telemetry/step_s"])
    for rank in range(ranks):
        lines = [header]
        for step in range(7):
            cells = dict(zip(TIMES, (0.002 + rng.normal(0, 0.0001, len(TIMES))).tolist(), strict=True))
            if rank in stragglers_at:
                cells[phases[stragglers_at[rank]]] += 0.03
            elif stragglers_at:
                cells["telemetry/gradient_wait_s"] += 0.03
            rss = 2**30 * (20 if rank == 3 else 1)
            values = [*map(repr, cells.values()), str(2**30 * 40), str(rss), "0", repr(sum(cells.values()) + 0.001)]
            lines.append(",".join(["0", str(step), *values]))
        path = Path(rank_metrics_path(root, rank))
        path.parent.mkdir(parents=True)
        path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
        host = {"host": f"node-{rank // (ranks // hosts)}", "host_memory_bytes": 2**30 * 64, "pid": 1, "cpu_count": 8}
        Path(str(path) + ".host").write_text(json.dumps(host))


def test_the_command_at_1024_ranks_names_the_stragglers_briefly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = {5: "data loading", 700: "forward", **{rank: "data loading" for rank in range(100, 108)}}
    _write_run(tmp_path, 1024, 128, slow)
    assert main(["ranks", str(tmp_path), "--stragglers", "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "stragglers (10 rank(s)), the costliest first:" in text
    assert "and 7 more straggler(s) (--format json lists them all)" in text
    assert len(text.splitlines()) < 15 and len(text) < 2000
    assert main(["ranks", str(tmp_path), "--stragglers", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert {(s["rank"], s["phase"]) for s in document["stragglers"]} == set(slow.items())
    assert {s["pattern"] for s in document["stragglers"]} == {"chronic"}
    assert all(s["steps"] == [[1, 6]] and (s["held"], s["rows"]) == (6, 6) for s in document["stragglers"])
    assert {s["host"] for s in document["stragglers"] if s["rank"] == 700} == {"node-87"}
    # rank 3 holds 20 GiB: its host, node-0 (8 ranks), holds 27 GiB of 64 GiB: under half, no warning
    assert document["memory"][0]["host"] == "node-0" and document["memory"][0]["warn"] is False
    assert main(["ranks", str(tmp_path), "--stragglers", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(slow) and any(line.startswith("5,node-0,data loading,chronic,") for line in lines)


def test_the_summary_warns_when_a_host_is_mostly_held_by_its_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_run(tmp_path, 8, 2, {})
    for rank in range(4):  # node-0's four ranks: 20 + 3 x 1 GiB, then each loads its own 12 GiB copy of the data
        with RankMetricsWriter.for_rank(tmp_path, rank, resume_from_step=10**6) as writer:
            writer.reserve("telemetry/")
            rss = {"telemetry/rss_bytes": 2.0**30 * 13, "telemetry/workers_rss_bytes": 2.0**30 * (rank == 2)}
            writer.log_columns({**rss, "telemetry/host_used_bytes": 2.0**30 * 60}, 6)
    assert main(["ranks", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("memory")]
    assert lines == [
        "memory warning: host node-0: its 4 rank(s) held 53 GiB of its 64 GiB (83%) at step 6; the biggest, rank 2,"
        " 14 GiB (process 13 GiB, DataLoader workers 1 GiB). Over 50% of the host: if each rank holds its own copy of"
        " the data, load it once per host (shared or memory-mapped) or only each rank's shard"
    ]


def test_stragglers_without_telemetry_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with RankMetricsWriter.for_rank(tmp_path, 0) as writer:
        writer.log_metrics({"loss": 1.0}, step=0)
    assert main(["ranks", str(tmp_path), "--stragglers"]) == 1
    assert "hold no telemetry (turn it on with PerRankMetrics(telemetry=True))" in capsys.readouterr().err


def test_the_plot_has_a_time_row_at_1024_ranks(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _write_run(tmp_path, 1024, 128, {5: "data loading"})
    assert main(["ranks", str(tmp_path), "--stragglers", "--plot", str(tmp_path / "ranks.png")]) == 0
    from matplotlib.image import imread

    image = imread(tmp_path / "ranks.png")
    assert image.shape[0] > 300 and image.shape[1] > 1000  # drawn, at a readable size


def test_the_share_is_a_keyword_and_the_times_cannot_be_changed() -> None:
    """``find_stragglers(table, 0.1)`` would read as a row count or a rank: the share is named, always; and the
    times a verdict reads are fixed once read."""
    table = pd.DataFrame(
        [{"rank": rank, "step": step, "telemetry/step_s": 0.05, "telemetry/data_wait_s": 0.001 + 0.04 * rank,
          "telemetry/forward_s": 0.004, "telemetry/backward_s": 0.004, "telemetry/collectives_s": 0.0,
          "telemetry/gradient_wait_s": 0.041 - 0.04 * rank} for step in range(4) for rank in range(2)]
    )  # fmt: skip
    times = rank_times(table)
    positionals = (lambda: find_stragglers(table, 0.1), lambda: verdict(times, 0.1),
                   lambda: rule.stragglers(times, 0.1), lambda: rank_times(table, 0))  # fmt: skip
    for positional in positionals:
        with pytest.raises(TypeError):
            positional()
    assert find_stragglers(table, min_share=0.1)["rank"].tolist() == [1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        times.step = times.wait  # type: ignore[misc]
