"""The straggler verdict and the per-host memory check against an independent reference, and as the command prints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_ext.cli import main
from lightning_ext.rank_metrics import RankMetricsWriter, rank_metrics_path
from lightning_ext.rank_spread import find_stragglers, host_memory
from tests.helpers.straggler_reference import VERDICT, host_peaks, stragglers

TIMES = ["telemetry/step_s", "telemetry/data_wait_s", "telemetry/forward_s", "telemetry/optimizer_s"]
# few distinct values, so that ties, a MAD of 0 and equal medians come up often; NaN: a cell not written
seconds = st.sampled_from([0.0, 0.001, 0.002, 0.01, 0.0105, 0.05, 0.1, 0.3, math.nan])


@st.composite
def telemetry_tables(draw: st.DrawFn) -> tuple[pd.DataFrame, dict[int, list[dict[str, float]]]]:
    world = draw(st.integers(1, 40))
    samples: dict[int, list[dict[str, float]]] = {}
    rows = []
    for rank in range(world):
        count = draw(st.integers(1, 4))
        samples[rank] = []
        for step in range(count):
            row = {column: draw(seconds) for column in TIMES}
            row["telemetry/step_s"] = draw(st.sampled_from([0.05, 0.1, 0.1, 0.2]))  # written on every row
            samples[rank].append(row)
            rows.append({"rank": rank, "step": step, **row})
    return pd.DataFrame(rows), samples


@given(telemetry_tables())
def test_the_verdict_is_the_reference_rule(case: tuple[pd.DataFrame, dict[int, list[dict[str, float]]]]) -> None:
    table, samples = case
    found = find_stragglers(table)
    assert set(zip(found["rank"], found["phase"])) == stragglers(samples)
    for record in found.itertuples():
        assert record.seconds > record.median and record.excess_s == pytest.approx(record.seconds - record.median)


def test_a_straggler_is_named_with_how_much_slower() -> None:
    # 40 ranks: data wait 10 ms +- noise; rank 7 waits 60 ms; rank 9's optimizer is 5 us slower (not material)
    rng = np.random.default_rng(0)
    rows = []
    for rank in range(40):
        for step in range(5):
            data = 0.010 + rng.normal(0, 0.0003) + (0.05 if rank == 7 else 0.0)
            optimizer = 0.001 + rng.normal(0, 1e-6) + (5e-6 if rank == 9 else 0.0)
            rows.append(
                {"rank": rank, "step": step, "telemetry/step_s": 0.1, "telemetry/data_wait_s": data,
                 "telemetry/optimizer_s": optimizer}
            )  # fmt: skip
    found = find_stragglers(pd.DataFrame(rows))
    assert found[["rank", "phase"]].values.tolist() == [[7, "data wait"]]
    assert found.at[0, "ratio"] == pytest.approx(6.0, rel=0.05)
    assert found.at[0, "excess_s"] == pytest.approx(0.05, rel=0.05)
    assert found.at[0, "share"] == pytest.approx(0.5, rel=0.05)
    # with no floor on how much a phase costs, rank 9's optimizer would stand out too
    assert (9, "optimizer") in set(zip(*find_stragglers(pd.DataFrame(rows), min_share=0.0)[["rank", "phase"]].values.T))


def test_backward_and_collectives_never_name_a_straggler() -> None:
    """Under DDP the healthy rank waits the longest there (here rank 0 of 3, the others being slow elsewhere)."""
    rows = [
        {"rank": rank, "step": 0, "telemetry/step_s": 0.05, "telemetry/backward_s": backward,
         "telemetry/collectives_s": backward}
        for rank, backward in [(0, 0.04), (1, 0.002), (2, 0.003)]
    ]  # fmt: skip
    assert find_stragglers(pd.DataFrame(rows)).empty


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
    """``ranks`` rank files of 6 telemetry rows each, ``ranks // hosts`` ranks per host; slow ranks as given.

    Written as plain CSV text (fast at 1,024 ranks); the reader reads any file in the format.
    """
    rng = np.random.default_rng(1)
    times = [column for column in VERDICT.values() if column != "telemetry/step_s"]
    memory = ["telemetry/host_used_bytes", "telemetry/rss_bytes", "telemetry/workers_rss_bytes"]
    header = ",".join(["epoch", "step", *times, *memory, "telemetry/step_s"])
    for rank in range(ranks):
        lines = [header]
        for step in range(6):
            cells = 0.01 + rng.normal(0, 0.0002, len(times))
            if rank in stragglers_at:
                cells[times.index(VERDICT[stragglers_at[rank]])] += 0.03
            rss = 2**30 * (20 if rank == 3 else 1)
            lines.append(",".join(["0", str(step), *map(repr, cells.tolist()), str(2**30 * 40), str(rss), "0", "0.08"]))
        path = Path(rank_metrics_path(root, rank))
        path.parent.mkdir(parents=True)
        path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
        host = {"host": f"node-{rank // (ranks // hosts)}", "host_memory_bytes": 2**30 * 64, "pid": 1, "cpu_count": 8}
        Path(str(path) + ".host").write_text(json.dumps(host))


def test_the_command_at_1024_ranks_names_the_stragglers_briefly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = {5: "data wait", 700: "forward", **{rank: "data wait" for rank in range(100, 108)}}
    _write_run(tmp_path, 1024, 128, slow)
    assert main(["ranks", str(tmp_path), "--stragglers", "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "stragglers (10 rank(s)):" in text
    assert "and 6 more rank(s) in data wait (--format json lists them all)" in text
    assert len(text.splitlines()) < 15 and len(text) < 2000
    assert main(["ranks", str(tmp_path), "--stragglers", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert {(s["rank"], s["phase"]) for s in document["stragglers"]} == set(slow.items())
    assert {s["host"] for s in document["stragglers"] if s["rank"] == 700} == {"node-87"}
    # rank 3 holds 20 GiB: its host, node-0 (8 ranks), holds 27 GiB of 64 GiB: under half, no warning
    assert document["memory"][0]["host"] == "node-0" and document["memory"][0]["warn"] is False
    assert main(["ranks", str(tmp_path), "--stragglers", "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 + len(slow)


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
    _write_run(tmp_path, 1024, 128, {5: "data wait"})
    assert main(["ranks", str(tmp_path), "--stragglers", "--plot", str(tmp_path / "ranks.png")]) == 0
    from matplotlib.image import imread

    image = imread(tmp_path / "ranks.png")
    assert image.shape[0] > 300 and image.shape[1] > 1000  # drawn, at a readable size
