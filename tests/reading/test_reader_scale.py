"""The reader at scale: both CSV engines give the same table, reading less, skipping bad files, refusing mixed runs.

The expected tables are built with plain ``pandas.read_csv`` on each file (never with lightning_ext); the files are
written here byte by byte, in the writer's documented format (``docs/per-rank-metrics.md``).
"""

import importlib.util
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_ext import RankMetricsError, RankMetricsWarning, read_rank_metrics
from lightning_ext._reading import fast_csv as _fast_csv
from lightning_ext.rank_metrics import MixedRunsError

REPO = Path(__file__).resolve().parents[2]
HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None
NEEDS_PYARROW = pytest.mark.skipif(not HAS_PYARROW, reason="pyarrow is not installed (the fast extra)")
ENGINES = [pytest.param("pyarrow", marks=NEEDS_PYARROW), "pandas"]


def put(log_dir: Path, relative: str, text: str | bytes) -> Path:
    path = log_dir / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def rank_file(log_dir: Path, rank: int, header: list[str], rows: list[list[object]]) -> Path:
    lines = [",".join(header)] + [",".join("" if cell is None else repr(cell) for cell in row) for row in rows]
    return put(log_dir, f"rank_{rank}/metrics.csv", "".join(line + "\r\n" for line in lines))


def reference(log_dir: Path, ranks: list[int]) -> pd.DataFrame:
    """Plain pandas: each file read on its own, a rank column, concatenated, the reader's column order and types."""
    frames = []
    for rank in ranks:
        frame = pd.read_csv(log_dir / f"rank_{rank}" / "metrics.csv", keep_default_na=False, na_values=["", "nan"])
        frames.append(frame.assign(rank=rank))
    table = pd.concat(frames, ignore_index=True)
    metrics = sorted(set(table.columns) - {"rank", "step", "epoch"})
    if "epoch" not in table:
        table["epoch"] = pd.NA
    types = {"rank": "int64", "step": "int64", "epoch": "Int64", **dict.fromkeys(metrics, "float64")}
    return table[["rank", "step", "epoch", *metrics]].astype(types)


def many_ranks(log_dir: Path, ranks: int = 12, rows: int = 40) -> None:
    """Ranks with the same steps; val_loss only every 10 rows; rank 5 gains a metric the others lack."""
    rng = np.random.default_rng(0)
    for rank in range(ranks):
        header = ["epoch", "loss", "step", "val_loss"] + (["z_extra"] if rank == 5 else [])
        body = []
        for step in range(rows):
            row: list[object] = [step // 10, float(np.float32(rng.random())), step, None]
            if step % 10 == 9:
                row[3] = float(rng.standard_normal())
            body.append(row + ([float(step)] if rank == 5 else []))
        rank_file(log_dir, rank, header, body)


@pytest.mark.parametrize("engine", ENGINES)
def test_many_ranks_read_as_plain_pandas_reads_them(tmp_path, engine):
    many_ranks(tmp_path)
    pd.testing.assert_frame_equal(read_rank_metrics(tmp_path, engine=engine), reference(tmp_path, list(range(12))))


@NEEDS_PYARROW
def test_pyarrow_blocks_of_any_size_give_the_same_table(tmp_path, monkeypatch):
    many_ranks(tmp_path)
    expected = reference(tmp_path, list(range(12)))
    for size in (64, 700, 1 << 20):  # many blocks per file (parsed in parallel), a few, one
        monkeypatch.setattr(_fast_csv, "BLOCK_BYTES", size)
        pd.testing.assert_frame_equal(read_rank_metrics(tmp_path, engine="pyarrow"), expected)


@pytest.mark.parametrize("engine", ENGINES)
def test_read_less_metrics_ranks_and_a_step_range(tmp_path, engine):
    many_ranks(tmp_path)
    full = reference(tmp_path, list(range(12)))
    table = read_rank_metrics(tmp_path, metrics=["val_loss"], ranks=[3, 5, 11], min_step=9, max_step=29, engine=engine)
    rows = full["rank"].isin([3, 5, 11]) & full["step"].between(9, 29)
    expected = full.loc[rows, ["rank", "step", "epoch", "val_loss"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(table, expected)
    assert read_rank_metrics(tmp_path, min_step=1000, engine=engine).empty
    only_last = read_rank_metrics(tmp_path, min_step=39, engine=engine)
    assert only_last["rank"].tolist() == list(range(12)) and set(only_last["step"]) == {39}


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"metrics": "loss"}, TypeError, "metrics must be a list of metric names, not a str: use metrics=['loss']"),
        ({"metrics": ["loss", 3]}, TypeError, "metrics must be metric names (str), got int 3"),
        ({"metrics": ["step"]}, ValueError, "metrics: 'step' is always read; list metric columns only"),
        ({"metrics": ["nope"]}, ValueError, "Unknown metric(s) 'nope'; the metrics are: 'loss', 'val_loss', 'z_extra'"),
        ({"ranks": [0, -1]}, TypeError, "ranks must be whole numbers >= 0, got -1"),
        ({"ranks": [True]}, TypeError, "ranks must be whole numbers >= 0, got True"),
        ({"ranks": [2, 40, 41, 43]}, FileNotFoundError, "No file for ranks 40, 41 and 43 under {log_dir} (the ranks"),
        ({"min_step": 5, "max_step": 4}, ValueError, "min_step (5) is greater than max_step (4)"),
        ({"min_step": 1.5}, TypeError, "min_step must be an int or None, got float 1.5"),
        ({"engine": "polars"}, ValueError, "engine must be one of 'pyarrow', 'pandas' or None, got 'polars'"),
    ],
)
def test_bad_options_say_what_is_wrong(tmp_path, options, error, message):
    many_ranks(tmp_path)
    with pytest.raises(error, match="^" + re.escape(message.format(log_dir=tmp_path))):
        read_rank_metrics(tmp_path, **options)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("abc", "line 302, column 'loss': not a number: 'abc'"),
        ("NaN", "line 302, column 'loss': not a number: 'NaN'"),  # pyarrow reads it, pandas does not
        ("1_0", "line 302, column 'loss': not a number: '1_0'"),  # Python's float() reads it, pandas does not
        ('"1.5"x', "line 302"),
        ("1.5,7", "line 302: expected 3 fields, saw 4"),
    ],
)
def test_a_bad_cell_deep_in_one_of_many_files_is_named_with_its_line(tmp_path, engine, cell, message):
    for rank in range(20):
        rows = "".join(f"{step / 7!r},{step},0.5\r\n" for step in range(400))
        if rank == 13:
            rows = rows.replace(f"{300 / 7!r},300,", f"{cell},300,")
        put(tmp_path, f"rank_{rank}/metrics.csv", "loss,step,zeta\r\n" + rows)
    bad = tmp_path / "rank_13" / "metrics.csv"
    with pytest.raises(RankMetricsError, match="^" + re.escape(f"{bad}, {message}")):
        read_rank_metrics(tmp_path, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_bad_cell_in_a_column_not_read_is_not_checked(tmp_path, engine):
    put(tmp_path, "rank_0/metrics.csv", "acc,loss,step\r\n0.5,1.0,0\r\nbad,2.0,1\r\n")
    assert read_rank_metrics(tmp_path, metrics=["loss"], engine=engine)["loss"].tolist() == [1.0, 2.0]
    with pytest.raises(RankMetricsError, match="line 3, column 'acc': not a number: 'bad'"):
        read_rank_metrics(tmp_path, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_skip_bad_files_leaves_out_each_bad_rank_and_says_why(tmp_path, engine):
    many_ranks(tmp_path, ranks=6)
    put(tmp_path, "rank_2/metrics.csv", "loss,step\r\n1.0,0\r\n2.0\r\n")  # a short row
    put(tmp_path, "rank_4/metrics.csv", b"loss,step\r\n\xff,0\r\n")
    (tmp_path / "rank_3" / "metrics.csv").unlink()
    (tmp_path / "rank_3" / "metrics.csv").symlink_to(tmp_path / "nowhere")  # listed, cannot be read
    with pytest.warns(RankMetricsWarning) as caught:
        table = read_rank_metrics(tmp_path, skip_bad_files=True, engine=engine)
    pd.testing.assert_frame_equal(table, reference(tmp_path, [0, 1, 5]))
    messages = [str(warning.message) for warning in caught]
    assert messages[0] == f"rank 2: skipped: {tmp_path / 'rank_2' / 'metrics.csv'}, line 3: expected 2 fields, saw 1"
    assert messages[1].startswith(f"rank 3: skipped: {tmp_path / 'rank_3' / 'metrics.csv'}: cannot be read: ")
    assert messages[2].startswith(f"rank 4: skipped: {tmp_path / 'rank_4' / 'metrics.csv'}, line 2: not UTF-8")
    with pytest.raises(RankMetricsError, match="line 3: expected 2 fields"):
        read_rank_metrics(tmp_path, engine=engine)


def test_files_moved_aside_a_different_number_of_times_are_refused(tmp_path):
    many_ranks(tmp_path, ranks=8)
    for rank in range(4):  # a later run with 4 ranks moved ranks 0-3's files aside; 4-7's are the earlier run's
        os.rename(tmp_path / f"rank_{rank}" / "metrics.csv", tmp_path / f"rank_{rank}" / "metrics.csv.1")
        rank_file(tmp_path, rank, ["loss", "step"], [[0.5, 0]])
    with pytest.raises(MixedRunsError) as refused:
        read_rank_metrics(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path} holds files of more than one run: ")
    assert f"ranks 0-3 have earlier runs' files up to .1 ({tmp_path / 'rank_0' / 'metrics.csv.1'}, " in message
    assert (
        f"ranks 4-7 have none, so their files may be an earlier run's ({tmp_path / 'rank_4' / 'metrics.csv'}" in message
    )
    assert "and 1 more" in message and "allow_mixed=True" in message
    assert read_rank_metrics(tmp_path, ranks=[0, 1, 2, 3])["loss"].tolist() == [0.5] * 4  # one run's ranks
    assert len(read_rank_metrics(tmp_path, allow_mixed=True)) == 4 + 4 * 40


def test_files_moved_aside_alike_on_every_rank_are_one_run(tmp_path):
    for rank in range(3):
        rank_file(tmp_path, rank, ["loss", "step"], [[9.0, 0]])
        os.rename(tmp_path / f"rank_{rank}" / "metrics.csv", tmp_path / f"rank_{rank}" / "metrics.csv.1")
        rank_file(tmp_path, rank, ["loss", "step"], [[1.0, 0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_rank_metrics(tmp_path)["loss"].tolist() == [1.0] * 3


def test_a_file_with_no_metric_in_common_or_another_first_step_is_refused(tmp_path):
    many_ranks(tmp_path, ranks=4)
    other = rank_file(tmp_path, 2, ["acc", "step"], [[0.5, 0]])
    with pytest.raises(MixedRunsError, match=re.escape(f"{other} share no metric with ranks 0, 1 and 3 (theirs: ")):
        read_rank_metrics(tmp_path)
    later = rank_file(tmp_path, 2, ["loss", "step"], [[0.5, 5000], [0.4, 5001]])
    expected = f"{later} at step 5000 start(s) at another step than ranks 0, 1 and 3 (step 0)"
    with pytest.raises(MixedRunsError, match=re.escape(expected)):
        read_rank_metrics(tmp_path)
    assert read_rank_metrics(tmp_path, allow_mixed=True)["rank"].tolist().count(2) == 2


CELLS = st.text(alphabet="0123456789+-.eEnaifINT\"' \r\t\0é", max_size=6)


@NEEDS_PYARROW
@settings(max_examples=300, deadline=None)
@given(cells=st.lists(st.tuples(CELLS, CELLS), min_size=1, max_size=4))
def test_property_both_engines_agree_on_any_cells(cells, tmp_path_factory):
    """Whatever the cells, both engines give the same table, or the same error."""
    log_dir = tmp_path_factory.mktemp("cells")
    body = "".join(f"{a},{b},{step}\r\n" for step, (a, b) in enumerate(cells))
    put(log_dir, "rank_0/metrics.csv", "a,b,step\r\n" + body)
    outcomes = []
    for engine in ("pyarrow", "pandas"):
        try:
            outcomes.append(read_rank_metrics(log_dir, engine=engine))
        except (RankMetricsError, ValueError) as error:
            outcomes.append(f"{type(error).__name__}: {error}")
    if isinstance(outcomes[0], pd.DataFrame) and isinstance(outcomes[1], pd.DataFrame):
        pd.testing.assert_frame_equal(outcomes[0], outcomes[1])
        for column in ("a", "b"):  # bit for bit, the sign of zero included
            assert outcomes[0][column].to_numpy().tobytes() == outcomes[1][column].to_numpy().tobytes()
    else:
        assert outcomes[0] == outcomes[1]


@NEEDS_PYARROW
@pytest.mark.timeout(120)
def test_without_pyarrow_installed_the_table_is_the_same(tmp_path):
    """A process where ``import pyarrow`` fails reads the same table (compared as pickles) as this one."""
    many_ranks(tmp_path)
    script = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from lightning_ext._reading.fast_csv import default_engine\n"
        "from lightning_ext import read_rank_metrics\n"
        "assert default_engine() == 'pandas', default_engine()\n"
        f"read_rank_metrics({str(tmp_path)!r}).to_pickle({str(tmp_path / 'without.pkl')!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert process.returncode == 0, process.stderr
    without, with_pyarrow = pd.read_pickle(tmp_path / "without.pkl"), read_rank_metrics(tmp_path)
    # pandas itself stores the column names as pyarrow strings where pyarrow is installed: the names are compared
    pd.testing.assert_frame_equal(without, with_pyarrow, check_column_type=False)
    assert without.columns.tolist() == with_pyarrow.columns.tolist()


@settings(max_examples=300, deadline=None)
@given(
    cells=st.lists(st.tuples(CELLS, CELLS), min_size=1, max_size=4),
    engine=st.sampled_from(["pyarrow", "pandas"] if HAS_PYARROW else ["pandas"]),
)
def test_property_the_fast_path_returns_what_the_exact_path_returns(cells, engine):
    """Where the row-by-row checks accept a file, the fast path returns the same arrays; where they refuse it, the
    fast path does not return anything either (it hands the file to them)."""
    body = "".join(f"{a},{b},{step}\r\n" for step, (a, b) in enumerate(cells))
    layout = _fast_csv.split_file(("a,b,step\r\n" + body).encode(), "f.csv")
    try:
        exact = _fast_csv.parse_exact(layout, ["step", "a", "b"])
    except RankMetricsError as error:
        with pytest.raises(RankMetricsError) as fast:
            _fast_csv.parse(layout, ["step", "a", "b"], engine)
        assert str(fast.value) == str(error)
        return
    fast = _fast_csv.parse(layout, ["step", "a", "b"], engine)
    assert [array.dtype for array in fast] == [array.dtype for array in exact]
    assert [array.tobytes() for array in fast] == [array.tobytes() for array in exact]


@pytest.mark.parametrize("engine", ["pyarrow", "pandas"] if HAS_PYARROW else ["pandas"])
def test_a_bare_carriage_return_in_a_cell_is_refused_by_the_fast_path_as_by_the_checks(engine: str) -> None:
    """Found by the property above: pyarrow took a lone ``\\r`` for a line end and returned a row."""
    layout = _fast_csv.split_file(b"a,b,step\r\n\r,,0\r\n", "f.csv")
    with pytest.raises(RankMetricsError, match=r"^f\.csv, line 2: expected 3 fields, saw 0$"):
        _fast_csv.parse(layout, ["step", "a", "b"], engine)


@pytest.mark.parametrize("engine", ["pyarrow", "pandas"] if HAS_PYARROW else ["pandas"])
@pytest.mark.parametrize(
    "body",
    [
        b"1,2,0\r3,4,1\r\n",  # a bare carriage return between two rows that each have every field: two lines
        b"1,2,0\r\n3,4,1\r\r\n",  # one before a line end: a blank line after it
        b"1,2,0\n\r3,4,1\r\n",  # one after a bare line feed: a blank line
        b"1,2,0\r\n\r\n3,4,2\r\n",  # a blank line: a row of missing cells to pyarrow
    ],
    ids=["between_rows", "before_line_end", "after_line_feed", "blank_line"],
)
def test_lines_the_engines_split_otherwise_than_the_checks_read_as_the_checks_read_them(
    tmp_path: Path, engine: str, body: bytes
) -> None:
    """The fast path counts an engine's rows against the line feeds (no other pass over the bytes): where a carriage
    return or a blank line makes them differ, the row-by-row checks decide, and the reader returns or raises what
    they do."""
    put(tmp_path, "rank_0/metrics.csv", (b"a,b,step\r\n" + body).decode())
    layout = _fast_csv.split_file(b"a,b,step\r\n" + body, str(tmp_path / "rank_0" / "metrics.csv"))
    try:
        exact = _fast_csv.parse_exact(layout, ["step", "a", "b"])
    except RankMetricsError as error:
        with pytest.raises(RankMetricsError) as raised:
            read_rank_metrics(tmp_path, engine=engine)
        assert str(raised.value) == str(error)
        return
    table = read_rank_metrics(tmp_path, engine=engine)
    assert [table[name].tolist() for name in ("step", "a", "b")] == [array.tolist() for array in exact]
