"""``lightning-ext ranks``: the spread summary, the plot, and every error path with its exit code."""

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lightning_ext import read_rank_metrics
from lightning_ext.cli import main
from lightning_ext.rank_metrics import RankMetricsWriter, rank_metrics_path
from lightning_ext.rank_spread import summarize_spread

# rank -> rows of (step, metrics); last loss per rank: 2.0, 2.0, 5.0 (median 2, std sqrt(3), rank 2 is farthest)
RUNS = {
    0: [(0, {"loss": 9.0, "acc": 0.25}), (1, {"loss": 2.0}), (2, {"acc": 0.75})],
    1: [(0, {"loss": 8.0}), (1, {"loss": 2.0})],
    2: [(0, {"loss": 7.0, "acc": 0.5}), (1, {"loss": 5.0, "acc": 0.5, "a,b\nc": 1.0})],
}


@pytest.fixture
def log_dir(tmp_path):
    for rank, rows in RUNS.items():
        with RankMetricsWriter.for_rank(tmp_path, rank) as writer:
            for step, metrics in rows:
                writer.log_metrics(metrics, step=step)
    return tmp_path


def test_summary_numbers_on_a_known_table(log_dir):
    summary = summarize_spread(read_rank_metrics(log_dir))
    assert summary.index.tolist() == ["a,b\nc", "acc", "loss"]
    assert summary.columns.tolist() == ["rank 0", "rank 1", "rank 2", "min", "max", "std", "outlier_rank"]
    floats = summary.drop(columns="outlier_rank")
    assert floats.loc["loss"].tolist() == [2.0, 2.0, 5.0, 2.0, 5.0, math.sqrt(3)]
    # rank 0's last acc is at step 2, after a row without it; rank 1 never logged acc
    assert [repr(value) for value in floats.loc["acc"]] == ["0.75", "nan", "0.5", "0.5", "0.75", "0.1767766952966369"]
    # one rank only: no spread
    assert [repr(value) for value in floats.loc["a,b\nc"]] == ["nan", "nan", "1.0", "1.0", "1.0", "nan"]
    # loss: rank 2 is 3 from the median; acc: median 0.625, both 0.125 away, the lower rank is named; a,b: none
    assert summary["outlier_rank"].tolist() == [pd.NA, 0, 2]


def test_ranks_prints_a_fixed_width_table(log_dir, capsys):
    assert main(["ranks", str(log_dir)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        f"{log_dir}: 3 rank(s), 7 row(s), 3 metric(s)",
        "metric  rank 0  rank 1  rank 2  min  max      std outlier_rank",
        "a,b\\nc       -       -       1    1    1        -            -",
        "acc       0.75       -     0.5  0.5 0.75 0.176777            0",
        "loss         2       2       5    2    5  1.73205            2",
        # ranks 1 and 2 logged no row at step 2 (a straggler, or a crash, would show so)
        "behind (the other ranks reach step 2): rank 1 (last step 1); rank 2 (last step 1)",
    ]


def test_ranks_metric_selection_in_the_order_given(log_dir, capsys):
    assert main(["ranks", str(log_dir), "--metric", "loss", "--metric", "acc"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:4]
    assert [row.split()[0] for row in rows] == ["loss", "acc"]


def test_ranks_plot_writes_a_png(log_dir, tmp_path, capsys):
    image = tmp_path / "curves.png"
    assert main(["ranks", str(log_dir), "--plot", str(image), "--metric", "loss", "acc"]) == 0
    data = image.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert capsys.readouterr().out.endswith(f"wrote {image}\n")


def test_ranks_plot_without_matplotlib_exits_2_with_the_install_hint(log_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    image = tmp_path / "curves.png"
    assert main(["ranks", str(log_dir), "--plot", str(image)]) == 2
    out, err = capsys.readouterr()
    assert err == "lightning-ext ranks: --plot needs matplotlib: pip install 'lightning-ext[plot]'\n"
    assert out == "" and not image.exists()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["{log_dir}/missing"], "No such log directory: {log_dir}/missing"),
        (["{log_dir}/rank_0"], "No rank_<r>/metrics.csv was found under {log_dir}/rank_0"),
        (["{log_dir}", "--metric", "nope"], "Unknown metric(s) 'nope'; the metrics are: 'a,b\\nc', 'acc', 'loss'"),
        (["{log_dir}", "--filename", "metrics.csv"], "filename must be a relative path with '{{rank}}' in it"),
    ],
)
def test_ranks_errors_are_one_line_with_exit_code_1(log_dir, capsys, arguments, message):
    assert main(["ranks", *[argument.format(log_dir=log_dir) for argument in arguments]]) == 1
    out, err = capsys.readouterr()
    assert err.startswith(f"lightning-ext ranks: error: {message.format(log_dir=log_dir)}")
    assert err.count("\n") == 1 and out == ""


def test_ranks_lists_a_malformed_file_as_skipped_and_summarizes_the_rest(log_dir, capsys):
    bad = Path(rank_metrics_path(log_dir, 1))
    bad.write_bytes(b"loss,step\r\n1,0,0\r\n")
    assert main(["ranks", str(log_dir)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"{log_dir}: 2 rank(s), 5 row(s), 3 metric(s), skipped: rank 1"
    assert lines[1].split() == ["metric", "rank", "0", "rank", "2", "min", "max", "std", "outlier_rank"]
    assert f"skipped: rank 1 ({bad}, line 2: expected 2 fields, saw 3)" in lines
    assert err == ""


def test_ranks_reports_a_torn_line_as_a_warning_line(log_dir, capsys):
    with Path(rank_metrics_path(log_dir, 1)).open("ab") as handle:
        handle.write(b"3.0,")
    assert main(["ranks", str(log_dir)]) == 0
    torn = Path(rank_metrics_path(log_dir, 1))
    expected = f"lightning-ext ranks: warning: {torn}, line 4: ignored an incomplete last line (a write cut short)\n"
    assert capsys.readouterr().err == expected


@pytest.mark.parametrize("arguments", [[], ["ranks"], ["nosuch"], ["ranks", "x", "--bogus"]])
def test_usage_errors_exit_2(arguments, capsys):
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == 2 and "usage: lightning-ext" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_python_dash_m_reports_an_error_without_a_traceback(tmp_path):
    process = subprocess.run(
        [sys.executable, "-m", "lightning_ext", "ranks", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 1
    assert process.stderr == f"lightning-ext ranks: error: No such log directory: {tmp_path / 'missing'}\n"
