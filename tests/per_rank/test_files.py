"""The per-rank metrics writer and reader: same bytes as stock Lightning, exact round trip, resume, bad input."""

import locale
import os
import re
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightning.fabric.loggers.csv_logs import _ExperimentWriter

from lightning_ext import RankMetricsError, read_rank_metrics
from lightning_ext.rank_metrics import RankMetricsWriter, rank_metrics_path
from tests.helpers.writer_calls import call_sequences

UTF8_LOCALE = locale.getpreferredencoding(False).lower().replace("-", "") == "utf8"


def write(path: Path, calls: list[tuple[dict[str, float | int], int]], **options: int) -> RankMetricsWriter:
    with RankMetricsWriter(path, **options) as writer:
        for metrics, step in calls:
            writer.log_metrics(metrics, step=step)
    return writer


def float_reprs(column: pd.Series) -> list[str]:
    """Exact comparison, sign of zero included (``==`` says -0.0 == 0.0 and NaN != NaN)."""
    return [repr(float(value)) for value in column]


@pytest.mark.skipif(not UTF8_LOCALE, reason="stock Lightning writes in the locale's encoding; this writer in UTF-8")
@given(calls=call_sequences(), flush_every=st.integers(1, 5))
def test_property_bytes_equal_stock_experiment_writer(calls, flush_every):
    with tempfile.TemporaryDirectory() as directory:
        stock = _ExperimentWriter(os.path.join(directory, "stock"))
        for metrics, step in calls:
            stock.log_metrics(dict(metrics), step)
            stock.save()
        ours = write(Path(directory, "ours", "metrics.csv"), calls, flush_every_n_rows=flush_every)
        assert Path(ours.path).read_bytes() == Path(stock.metrics_file_path).read_bytes()


@given(ranks=st.lists(call_sequences(), min_size=1, max_size=3), flush_every=st.integers(1, 5))
def test_property_reader_returns_exactly_what_was_written(ranks, flush_every):
    with tempfile.TemporaryDirectory() as directory:
        expected_rows = []
        for rank, calls in enumerate(ranks):
            write(Path(rank_metrics_path(directory, rank)), calls, flush_every_n_rows=flush_every)
            expected_rows += [{"rank": rank, "step": step, **metrics} for metrics, step in calls]
        # ranks of random steps and names are not one run: allow_mixed reads them as they are
        table = read_rank_metrics(directory, allow_mixed=True)
    metrics = sorted({name for calls in ranks for row, _ in calls for name in row})
    assert list(table.columns) == ["rank", "step", "epoch", *metrics]
    assert table["rank"].tolist() == [row["rank"] for row in expected_rows]
    assert table["step"].tolist() == [row["step"] for row in expected_rows]
    assert table["epoch"].isna().all()
    assert table.dtypes.drop(["rank", "step", "epoch"]).eq(np.float64).all()
    for name in metrics:
        assert float_reprs(table[name]) == [repr(float(row.get(name, float("nan")))) for row in expected_rows]


def test_rows_are_buffered_and_each_flush_is_one_write(tmp_path, monkeypatch):
    path = tmp_path / "metrics.csv"
    writer = RankMetricsWriter(path, flush_every_n_rows=3)
    writer.log_metrics({"loss": 1.0}, step=0)
    writer.log_metrics({"loss": 2.0}, step=1)
    assert not path.exists() and writer.rows_written == 0
    writer.log_metrics({"loss": 3.0}, step=2)
    assert path.read_bytes() == b"loss,step\r\n1.0,0\r\n2.0,1\r\n3.0,2\r\n" and writer.rows_written == 3
    writes = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(bytes(data)) or real_write(fd, data))
    for step in range(3, 6):
        writer.log_metrics({"loss": 0.5}, step=step)
    monkeypatch.undo()
    assert writes == [b"0.5,3\r\n0.5,4\r\n0.5,5\r\n"]
    writer.log_metrics({"loss": 0.25}, step=6)
    writer.close()
    writer.close()  # idempotent
    assert path.read_bytes().endswith(b"0.5,5\r\n0.25,6\r\n") and writer.rows_written == 7
    with pytest.raises(ValueError, match="closed"):
        writer.log_metrics({"loss": 1.0}, step=7)


def test_numpy_scalars_are_written_as_numbers(tmp_path):
    writer = write(tmp_path / "m.csv", [({"a": np.float64(0.1), "b": np.float32(0.5), "c": np.int64(7)}, 0)])
    assert Path(writer.path).read_bytes() == b"a,b,c,step\r\n0.1,0.5,7,0\r\n"


@pytest.mark.parametrize(
    ("metrics", "step", "error", "message"),
    [
        ({"loss": "0.5"}, 3, TypeError, r"'loss' at step 3: expected an int or a float, got str"),
        ({"loss": None}, 4, TypeError, r"'loss' at step 4"),
        ({"flag": True}, 5, TypeError, r"'flag' at step 5"),
        ({"loss": 1.0}, 2.0, TypeError, r"step must be an int, got float"),
        ({"loss": 1.0}, True, TypeError, r"step must be an int, got bool"),
        ({"": 1.0}, 8, ValueError, r"non-empty"),
        ({3: 1.0}, 9, TypeError, r"Metric names must be str, got int 3 at step 9"),
        ({"bad\ud800": 1.0}, 10, ValueError, r"UTF-8"),
    ],
)
def test_bad_input_names_the_metric_and_step_and_logs_nothing(tmp_path, metrics, step, error, message):
    writer = RankMetricsWriter(tmp_path / "m.csv")
    writer.log_metrics({"loss": 1.0}, step=0)
    with pytest.raises(error, match=message):
        writer.log_metrics(metrics, step=step)
    writer.close()
    assert writer.rows_written == 1


@pytest.mark.parametrize("flush_every", [0, -1, 1.5, True])
def test_flush_interval_must_be_a_positive_int(tmp_path, flush_every):
    with pytest.raises(ValueError, match="flush_every_n_rows"):
        RankMetricsWriter(tmp_path / "m.csv", flush_every_n_rows=flush_every)


def steps_in(path: Path) -> list[int]:
    return pd.read_csv(path)["step"].tolist()


def test_resume_keeps_earlier_rows_drops_later_ones_and_never_duplicates_a_step(tmp_path):
    path = Path(rank_metrics_path(tmp_path, 0))
    write(path, [({"loss": step / 2}, step) for step in range(10)])
    before = path.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an intact file: nothing to repair
        writer = RankMetricsWriter(path, resume_from_step=5)
    assert writer.rows_written == 6 and writer.rotated_to is None
    assert before.startswith(path.read_bytes()) and steps_in(path) == list(range(6))
    for step in range(6, 9):
        writer.log_metrics({"loss": step / 2, "acc": 1.0}, step=step)
    writer.close()
    table = read_rank_metrics(tmp_path)
    assert table["step"].tolist() == list(range(9))
    assert table["loss"].tolist() == [step / 2 for step in range(9)]
    assert table["acc"].isna().tolist() == [True] * 6 + [False] * 3


def test_resume_that_drops_nothing_appends_to_the_same_file(tmp_path):
    path = tmp_path / "m.csv"
    write(path, [({"loss": 1.0}, 0), ({"loss": 2.0}, 1)])
    inode = path.stat().st_ino
    write(path, [({"loss": 3.0}, 2)], resume_from_step=1)
    assert path.stat().st_ino == inode  # appended, not rewritten
    assert path.read_bytes() == b"loss,step\r\n1.0,0\r\n2.0,1\r\n3.0,2\r\n"


def test_resume_without_a_file_starts_one(tmp_path):
    writer = write(tmp_path / "m.csv", [({"loss": 1.0}, 7)], resume_from_step=6)
    assert writer.rows_written == 1 and steps_in(writer.path) == [7]


def test_resume_refuses_a_malformed_file_and_leaves_it_alone(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes(b"loss,step\r\n1.0,0\r\n2.0,1,9\r\n")
    with pytest.raises(RankMetricsError, match=r"m\.csv, line 3: expected 2 fields, saw 3"):
        RankMetricsWriter(path, resume_from_step=0)
    assert path.read_bytes() == b"loss,step\r\n1.0,0\r\n2.0,1,9\r\n"


def test_a_fresh_run_rotates_the_old_file_and_deletes_nothing(tmp_path):
    path = Path(rank_metrics_path(tmp_path, 0))
    first = Path(write(path, [({"loss": 1.0}, 0)]).path).read_bytes()
    second_writer = write(path, [({"loss": 2.0}, 0)])
    second = path.read_bytes()
    third_writer = write(path, [({"loss": 3.0}, 0)])
    assert second_writer.rotated_to == str(path.with_name("metrics.csv.1"))
    assert third_writer.rotated_to == str(path.with_name("metrics.csv.2"))
    assert path.with_name("metrics.csv.1").read_bytes() == first
    assert path.with_name("metrics.csv.2").read_bytes() == second
    assert read_rank_metrics(tmp_path)["loss"].tolist() == [3.0]


def test_epoch_is_nullable_int_and_columns_are_the_union_over_ranks(tmp_path):
    write(Path(rank_metrics_path(tmp_path, 1)), [({"loss": 0.5}, 0)])
    write(Path(rank_metrics_path(tmp_path, 0)), [({"loss": 1.0, "epoch": 0, "only_zero": 2.0}, 0), ({"epoch": 1}, 1)])
    table = read_rank_metrics(tmp_path)
    assert list(table.columns) == ["rank", "step", "epoch", "loss", "only_zero"]
    assert str(table["epoch"].dtype) == "Int64"
    assert table["epoch"].tolist() == [0, 1, pd.NA]
    assert table["rank"].tolist() == [0, 0, 1]
    assert float_reprs(table["only_zero"]) == ["2.0", "nan", "nan"]


def test_a_header_only_file_is_a_rank_without_rows(tmp_path):
    write(Path(rank_metrics_path(tmp_path, 0)), [({"loss": 1.0}, 0)])
    Path(rank_metrics_path(tmp_path, 1)).parent.mkdir()
    Path(rank_metrics_path(tmp_path, 1)).write_bytes(b"acc,step\r\n")
    table = read_rank_metrics(tmp_path)
    assert table["rank"].tolist() == [0] and list(table.columns) == ["rank", "step", "epoch", "acc", "loss"]


def test_a_custom_file_name_template(tmp_path):
    for rank in (0, 2, 10):
        with RankMetricsWriter.for_rank(tmp_path, rank, filename="run/metrics-{rank}.csv") as writer:
            writer.log_metrics({"loss": float(rank)}, step=0)
    (tmp_path / "run" / "metrics-01.csv").write_bytes(b"loss,step\r\n9.0,0\r\n")  # not how rank 1 is spelled
    table = read_rank_metrics(tmp_path, filename="run/metrics-{rank}.csv")
    assert table["rank"].tolist() == [0, 2, 10] and table["loss"].tolist() == [0.0, 2.0, 10.0]
    with pytest.raises(ValueError, match="exactly once"):
        read_rank_metrics(tmp_path, filename="metrics.csv")


def put(tmp_path: Path, rank: int, content: bytes) -> Path:
    path = Path(rank_metrics_path(tmp_path, rank))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"acc,loss,step\r\n1,2,0\r\n1,2,1\r\n1,2,2\r\n1,2,3\r\n1,2,4\r\n1,2,5,6\r\n",
            r"line 7: expected 3 fields, saw 4",
        ),
        (b"acc,loss,step\r\n1,2,0\r\n1,2\r\n", r"line 3: expected 3 fields, saw 2"),
        (b"acc,loss,step\r\n1,2,0\r\n\r\n1,2,2\r\n", r"line 3: expected 3 fields, saw 0"),
        (b"acc,loss,step\r\n1,2,0\r\n1,abc,1\r\n", r"line 3, column 'loss': not a number: 'abc'"),
        (b'"two\nlines",step\r\n1,0\r\nNone,1\r\n', r"line 4, column 'two\\nlines': not a number: 'None'"),
        (b"loss,step\r\n1,0\r\n1,1.5\r\n", r"line 3, column 'step': expected a whole number, saw 1.5"),
        (b"loss,step\r\n1,0\r\n1,\r\n", r"line 3, column 'step': expected a whole number, saw nan"),
        (b"loss,epoch,step\r\n1,0.5,0\r\n", r"line 2, column 'epoch': expected a whole number"),
        (b"loss,epoch\r\n1,0\r\n", r"line 1: the header has no 'step' column"),
        (b"loss,loss,step\r\n1,1,0\r\n", r"line 1: duplicate column names \['loss'\]"),
        (b"loss,step\r\n1,0\r\n\xff,1\r\n", r"line 3: not UTF-8 text"),
    ],
)
def test_a_malformed_file_is_named_with_its_line_and_column(tmp_path, content, message):
    path = put(tmp_path, 1, content)
    put(tmp_path, 0, b"loss,step\r\n1,0\r\n")
    with pytest.raises(RankMetricsError, match="^" + re.escape(f"{path}, ") + message):
        read_rank_metrics(tmp_path)


def test_missing_or_empty_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f"No such log directory: {tmp_path / 'nope'}")):
        read_rank_metrics(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=re.escape(f"No rank_<r>/metrics.csv was found under {tmp_path}") + "$"):
        read_rank_metrics(tmp_path)
    (tmp_path / "rank_x").mkdir()
    (tmp_path / "rank_x" / "metrics.csv").write_bytes(b"loss,step\r\n")
    with pytest.raises(FileNotFoundError, match=re.escape("No rank_<r>/metrics.csv was found")):
        read_rank_metrics(tmp_path)


def test_reserved_names_are_written_under_their_own_columns_and_read_back(tmp_path):
    path = Path(rank_metrics_path(tmp_path, 0))
    with RankMetricsWriter(path) as writer:
        writer.log_metrics({"rank": 3.0, "step": 7, "metric:x": 1.0, "loss": 0.5}, step=2)
        writer.log_metrics({"rank": 4.0}, step=3)
    assert path.read_bytes() == (
        b"loss,metric:metric:x,metric:rank,metric:step,step\r\n0.5,1.0,3.0,7,2\r\n,,4.0,,3\r\n"
    )
    table = read_rank_metrics(tmp_path)
    assert list(table.columns) == ["rank", "step", "epoch", "loss", "metric:metric:x", "metric:rank", "metric:step"]
    assert table["rank"].tolist() == [0, 0] and table["step"].tolist() == [2, 3]  # the reader's own columns
    assert table["metric:rank"].tolist() == [3.0, 4.0] and table["metric:step"].tolist()[0] == 7.0
    assert list(pd.read_csv(path).columns) == ["loss", "metric:metric:x", "metric:rank", "metric:step", "step"]


@pytest.mark.parametrize("name", ["run [1]", "a*b?c", "{x}"])
def test_log_directories_with_glob_characters(tmp_path, name):
    log_dir = tmp_path / name
    for rank in (0, 1):
        with RankMetricsWriter.for_rank(log_dir, rank, flush_every_n_rows=1) as writer:
            writer.log_metrics({"loss": float(rank)}, step=0)
    (tmp_path / "run 1").mkdir()  # what "run [1]" would match as a pattern
    assert read_rank_metrics(log_dir)["loss"].tolist() == [0.0, 1.0]
