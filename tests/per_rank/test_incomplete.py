"""Incomplete per-rank files: the marker's documented locations and format, as the reader and the CLI report them,
and the per-rank logger's one-warning stop, in one process (the multi-rank runs are in test_per_rank_isolation.py).

The markers here are written by hand from ``docs/per-rank-metrics.md``, not by the code under test.
"""

import json
import re
import warnings
from pathlib import Path

import lightning.pytorch  # noqa: F401  (first, as in a training script: it registers the strategies)
import pytest

from lightning_ext import read_rank_metrics
from lightning_ext._per_rank.logger import RankMetricsLogger
from lightning_ext.cli import main
from lightning_ext.rank_metrics import RankMetricsWarning, RankMetricsWriter, incomplete_ranks

REASON = "OSError: [Errno 28] No space left on device (while writing a row)"


def two_ranks(log_dir: Path, rank_one: bool = True) -> None:
    for rank in (0, 1) if rank_one else (0,):
        with RankMetricsWriter.for_rank(log_dir, rank) as writer:
            for step in range(3 - rank):
                writer.log_metrics({"loss": float(step)}, step=step)


def marker(path: Path, **record: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": "lightning-ext per-rank metrics incomplete/1", **record}), encoding="utf-8")
    return path


def test_a_marker_beside_the_file_is_reported_by_the_reader_and_the_cli(tmp_path, capsys):
    two_ranks(tmp_path)
    beside = marker(tmp_path / "rank_1" / "metrics.csv.incomplete", rank=1, reason=REASON, rows_written=2, last_step=1)
    expected = f"stopped early after 2 row(s), the last at step 1: {REASON}"
    assert incomplete_ranks(tmp_path) == {1: expected}
    with pytest.warns(RankMetricsWarning) as caught:
        table = read_rank_metrics(tmp_path)
    assert [str(w.message) for w in caught] == [
        f"rank 1: {tmp_path / 'rank_1' / 'metrics.csv'} is incomplete: {expected} (marker: {beside})"
    ]
    assert table["rank"].tolist() == [0, 0, 0, 1, 1]  # the rows that were written are all there
    assert main(["ranks", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"{tmp_path}: 2 rank(s), 5 row(s), 1 metric(s), incomplete: rank 1"
    assert err == f"lightning-ext ranks: warning: {caught[0].message}\n"


def test_a_rank_without_a_file_is_reported_from_the_marker_in_the_log_dir(tmp_path):
    two_ranks(tmp_path, rank_one=False)
    (tmp_path / "rank_1").write_text("a file where rank 1's directory should be")
    fallback = marker(tmp_path / "rank_1_metrics.csv.incomplete", rank=1, file="run/rank_1/metrics.csv", reason="x")
    with pytest.warns(RankMetricsWarning, match=re.escape("rank 1: run/rank_1/metrics.csv is incomplete")) as caught:
        table = read_rank_metrics(tmp_path)
    assert str(fallback) in str(caught[0].message)
    assert table["rank"].unique().tolist() == [0]
    assert incomplete_ranks(tmp_path) == {1: "stopped early: x"}


def test_an_unreadable_marker_still_marks_the_file_incomplete_and_other_templates_ignore_it(tmp_path):
    two_ranks(tmp_path)
    (tmp_path / "rank_0" / "metrics.csv.incomplete").write_bytes(b"\xff not json")
    (tmp_path / "rank_1" / "metrics.csv.1.incomplete").write_text("{}")  # beside a rotated file: not this run's
    assert incomplete_ranks(tmp_path) == {
        0: f"stopped early: unreadable marker {tmp_path / 'rank_0' / 'metrics.csv.incomplete'}"
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert incomplete_ranks(tmp_path, filename="other_{rank}.csv") == {}


def test_the_logger_warns_once_keeps_buffered_rows_and_marks_the_file(tmp_path):
    logger = RankMetricsLogger(str(tmp_path), 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log_metrics({"loss": 1.0}, step=0)
        logger.log_metrics({"loss": float("nan"), "bad": "not a number"}, step=1)  # type: ignore[dict-item]
        logger.log_metrics({"loss": 2.0}, step=2)  # stopped: ignored
        logger.finalize("success")
        logger.close()
    ours = [str(w.message) for w in caught if issubclass(w.category, RankMetricsWarning)]
    assert len(ours) == 1 and logger.stopped
    file = tmp_path / "rank_1" / "metrics.csv"
    assert ours[0].startswith("Per-rank metrics of rank 1 stopped: TypeError: Metric 'bad' at step 1")
    assert f"{file} keeps the 1 row(s) written so far and is marked incomplete in {file}.incomplete" in ours[0]
    assert file.read_bytes() == b"loss,step\r\n1.0,0\r\n"  # the row buffered before the error
    record = json.loads((tmp_path / "rank_1" / "metrics.csv.incomplete").read_text())
    assert record["rank"] == 1 and record["rows_written"] == 1 and record["last_step"] == 0
    assert record["reason"].startswith("TypeError: Metric 'bad' at step 1") and record["file"] == str(file)
    assert RankMetricsLogger(str(tmp_path), 1).stopped  # a later stage in this process stays stopped


def test_when_no_marker_can_be_written_the_warning_says_so(tmp_path):
    log_dir = tmp_path / "not_a_dir"
    log_dir.write_text("a file where the log directory should be")
    logger = RankMetricsLogger(str(log_dir), 0)
    with pytest.warns(RankMetricsWarning, match=r"could not be marked incomplete either \((FileExists|NotADirectory)"):
        logger.log_metrics({"loss": 1.0}, step=0)


@pytest.mark.parametrize(
    ("resume", "kept"),
    # the marker: rows were written up to step 5; a resume from before step 5 logs every missing row again
    [(None, "moved"), (0, "removed"), (4, "removed"), (5, "kept"), (9, "kept")],
)
def test_a_marker_from_an_earlier_run_follows_its_file(tmp_path, resume, kept):
    two_ranks(tmp_path)
    beside = marker(tmp_path / "rank_1" / "metrics.csv.incomplete", rank=1, reason="r", rows_written=6, last_step=5)
    logger = RankMetricsLogger(str(tmp_path), 1)
    logger.resume_from_step = resume
    logger.log_metrics({"loss": 9.0}, step=6)
    logger.close()
    assert beside.exists() == (kept == "kept")
    rotated = tmp_path / "rank_1" / "metrics.csv.1.incomplete"
    assert rotated.exists() == (kept == "moved")
    if kept == "moved":
        assert json.loads(rotated.read_text())["last_step"] == 5


class _BrokenResultMetric:
    """Stands in for a ``_ResultMetric`` whose metadata cannot be read (a capture failure, in one process)."""

    is_tensor = True

    @property
    def meta(self) -> object:
        raise RuntimeError("metadata unavailable")


def test_a_capture_failure_never_reaches_the_step_and_is_reported_once(tmp_path, monkeypatch):
    from lightning_ext._per_rank import local_values as _local_values

    monkeypatch.setattr(_local_values, "_CAPTURE", _local_values._Capture())  # this test's own capture state
    _local_values.start_capture(rank=1)
    _local_values.record_update(_BrokenResultMetric(), value=None)  # inside Lightning's forward: must not raise
    assert not _local_values.capture_active()
    assert str(_local_values.capture_error()) == "metadata unavailable"
    logger = RankMetricsLogger(str(tmp_path), 1)
    with pytest.warns(RankMetricsWarning, match=r"stopped: RuntimeError: metadata unavailable \(while capturing"):
        logger.expect(trainer=None, metrics={})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logger.expect(trainer=None, metrics={})  # stopped: nothing more
        logger.log_metrics({"loss": 1.0}, step=0)
        logger.close()
    assert json.loads((tmp_path / "rank_1" / "metrics.csv.incomplete").read_text())["rows_written"] == 0
    _local_values.stop_capture()
