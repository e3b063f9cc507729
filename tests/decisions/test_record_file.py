"""The decision record's file, in one process: written row by row, crash-safe, on any fsspec URL, and read back."""

from __future__ import annotations

import json
import math
import tempfile
import warnings
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_ext import DecisionRecordError, DecisionRecordWarning, read_decisions
from lightning_ext._decisions.record_file import DecisionFile
from lightning_ext._files import file_output

HEADER = (
    "run,step,epoch,time,callback,monitor,mode,policy,world_size,outcome,values,votes,yes,agreed,saved_as,removed,"
    "best_before,best_after,best_path_before,best_path_after,reason"
)


def row(
    step: int, values: tuple[float | None, ...] = (0.5, 0.75), votes: tuple[bool | None, ...] = (True, False)
) -> dict[str, Any]:
    """A decision's row as the decisions build it (no ``run``, no ``time``: the file adds them)."""
    return {
        "step": step,
        "epoch": step // 10,
        "callback": "ModelCheckpoint",
        "monitor": "val_loss",
        "mode": "min",
        "policy": "all",
        "world_size": len(values),
        "outcome": "not saved",
        "values": values,
        "votes": votes,
        "yes": sum(bool(vote) for vote in votes),
        "agreed": None,
        "saved_as": None,
        "removed": None,
        "best_before": 0.25,
        "best_after": 0.25,
        "best_path_before": "/c/a.ckpt",
        "best_path_after": "/c/a.ckpt",
        "reason": "not saved: rank 1 voted no (0.75 is not better than its best 0.25); 'all' needs every rank",
    }


def cell_line(run: str, step: int, values: str = "0.5 0.75", votes: str = "1 0") -> str:
    return (
        f"{run},{step},0,2026-01-01T00:00:00+00:00,ModelCheckpoint,val_loss,min,all,2,saved,{values},{votes},1,,,,"
        ",,,,why\r\n"
    )


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test is a new process as far as the record knows (no file written here before, none stopped)."""
    monkeypatch.setattr(file_output, "_WRITTEN_HERE", set())
    monkeypatch.setattr(file_output, "_STOPPED_HERE", set())


def test_each_decision_is_in_the_file_as_soon_as_it_is_recorded(tmp_path: Path) -> None:
    record = DecisionFile(str(tmp_path), "run1")
    record.record(lambda: row(10))
    assert (tmp_path / "decisions.csv").read_bytes().count(b"\r\n") == 2  # no buffer: a SIGKILL now loses nothing
    record.record(lambda: row(20, (math.nan, -math.inf), (None, False)))
    record.close()
    text = (tmp_path / "decisions.csv").read_text()
    assert text.startswith(HEADER + "\n")
    table = read_decisions(tmp_path)
    assert list(table["step"]) == [10, 20] and list(table["run"]) == ["run1", "run1"]
    assert table["values"][0] == (0.5, 0.75)
    nan, minus_inf = table["values"][1]
    assert math.isnan(nan) and minus_inf == -math.inf  # non-finite values recorded as such
    assert table["votes"][1] == (None, False)
    assert table["time"].dt.tz is not None and table["yes"].dtype == "Int64"


def test_a_new_run_moves_an_earlier_record_aside_and_a_resumed_one_keeps_its_rows(tmp_path: Path) -> None:
    (tmp_path / "decisions.csv").write_text(HEADER + "\r\n" + "".join(cell_line("old", step) for step in (1, 2, 3)))
    fresh = DecisionFile(str(tmp_path), "new")
    fresh.record(lambda: row(1))
    fresh.close()
    assert list(read_decisions(tmp_path)["run"]) == ["new"]
    assert (tmp_path / "decisions.csv.1").read_text().count("old,") == 3  # nothing deleted

    file_output._WRITTEN_HERE.clear()  # another process resumes the run from step 1
    (tmp_path / "decisions.csv").write_text(HEADER + "\r\n" + "".join(cell_line("old", step) for step in (1, 2, 3)))
    resumed = DecisionFile(str(tmp_path), "resumed")
    resumed.resume_from_step = 2
    resumed.record(lambda: row(3))
    resumed.close()
    table = read_decisions(tmp_path)
    assert list(zip(table["run"], table["step"])) == [("old", 1), ("old", 2), ("resumed", 3)]


def test_a_failure_warns_once_marks_the_record_incomplete_and_never_raises(tmp_path: Path) -> None:
    record = DecisionFile(str(tmp_path), "run1")
    record.record(lambda: row(1))

    def broken() -> dict[str, Any]:
        raise KeyError("best_model_score")

    with pytest.warns(DecisionRecordWarning) as caught:
        record.record(broken)
        record.record(lambda: row(3))  # stopped: no second warning, nothing written
        record.close()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith("The decision record stopped: KeyError: 'best_model_score' (while building a row).")
    assert "keeps the 1 decision(s) written so far" in message and "Training goes on." in message
    with pytest.warns(DecisionRecordWarning, match=r"decisions.csv is incomplete: the record stopped early after 1"):
        table = read_decisions(tmp_path)
    assert list(table["step"]) == [1]
    assert DecisionFile(str(tmp_path), "again").stopped  # stays stopped for the rest of the process
    assert caught[0].filename == __file__  # the warning points at the caller of record(), not at lightning-ext


def test_an_earlier_marker_goes_once_a_resumed_run_decides_every_missing_step_again(tmp_path: Path) -> None:
    first = DecisionFile(str(tmp_path), "run1")
    for step in (1, 2):
        first.record(lambda step=step: row(step))
    first._storage = None  # the file is gone from under the record: its next row fails

    def broken() -> dict[str, Any]:
        raise OSError("disk full")

    with pytest.warns(DecisionRecordWarning):
        first.record(broken)
    marker = tmp_path / "decisions.csv.incomplete"
    assert json.loads(marker.read_text())["last_step"] == 2

    file_output._STOPPED_HERE.clear()  # another process resumes the run from step 1: steps 2... are decided again
    file_output._WRITTEN_HERE.clear()
    resumed = DecisionFile(str(tmp_path), "resumed")
    resumed.resume_from_step = 1
    resumed.record(lambda: row(2))
    resumed.close()
    assert not marker.exists()
    assert list(read_decisions(tmp_path)["step"]) == [1, 2]


def test_on_an_object_store_each_decision_is_a_part_merged_at_the_end() -> None:
    fs = fsspec.filesystem("memory")
    url = "memory://decision-record-test/v0"
    try:
        record = DecisionFile(url, "run1")
        record.record(lambda: row(1))
        record.record(lambda: row(2))
        parts = [name for name in fs.find("/decision-record-test/v0") if ".part-" in name]
        assert len(parts) == 2
        assert list(read_decisions(url)["step"]) == [1, 2]  # a run in progress (or killed) reads in full
        record.close()
        assert not [name for name in fs.find("/decision-record-test/v0") if ".part-" in name]
        assert list(read_decisions(url)["step"]) == [1, 2]
    finally:
        fs.rm("/decision-record-test", recursive=True)


def test_reading_where_there_is_no_record_says_when_one_is_written(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="No such log directory"):
        read_decisions(tmp_path / "missing")
    (tmp_path / "decisions.csv.1").write_text(HEADER + "\r\n")
    with pytest.raises(FileNotFoundError) as raised:
        read_decisions(tmp_path)
    message = str(raised.value)
    assert "there is no decisions.csv (earlier runs' records here: decisions.csv.1)" in message
    assert "Rank 0 writes it when a ModelCheckpoint or EarlyStopping decides" in message


def test_a_last_line_cut_short_is_skipped_with_a_warning(tmp_path: Path) -> None:
    text = HEADER + "\r\n" + cell_line("r", 1) + cell_line("r", 2)[:25]
    (tmp_path / "decisions.csv").write_text(text)
    with pytest.warns(DecisionRecordWarning, match=r"decisions.csv, line 3: ignored an incomplete last line"):
        table = read_decisions(tmp_path)
    assert list(table["step"]) == [1]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (cell_line("r", 1, values="0.5"), r"line 2, column 'values': 1 entries for world size 2"),
        (cell_line("r", 1, values="0.5 x"), r"line 2, column 'values': not numbers: '0.5 x'"),
        (cell_line("r", 1, votes="1 y"), r"line 2, column 'votes': expected 1, 0 or -, saw '1 y'"),
        (cell_line("r", 1).replace(",1,0,", ",1.5,0,", 1), r"line 2, column 'step': expected a whole number"),
        ("a,b\r\n", r"line 2: expected 21 fields, saw 2"),
    ],
)
def test_a_malformed_record_names_the_file_line_and_column(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "decisions.csv").write_text(HEADER + "\r\n" + line)
    with pytest.raises(DecisionRecordError, match=message):
        read_decisions(tmp_path)
    (tmp_path / "decisions.csv").write_text("step,loss\r\n1,2\r\n")
    with pytest.raises(DecisionRecordError, match="line 1: not a decision record: no column"):
        read_decisions(tmp_path)


def test_rows_of_two_runs_mixed_in_one_file_are_refused_unless_asked(tmp_path: Path) -> None:
    interleaved = [cell_line("a", 1), cell_line("b", 1), cell_line("a", 2), cell_line("b", 2)]
    (tmp_path / "decisions.csv").write_text(HEADER + "\r\n" + "".join(interleaved))
    with pytest.raises(DecisionRecordError, match=r"more than one run \(run a: row\(s\) 1-1, steps 1-1; run b"):
        read_decisions(tmp_path)
    assert len(read_decisions(tmp_path, allow_mixed=True)) == 4
    assert list(read_decisions(tmp_path, run="b")["step"]) == [1, 2]
    with pytest.raises(ValueError, match=r"No run 'c' in .*; its runs: a, b"):
        read_decisions(tmp_path, run="c")
    again = [cell_line("a", 5), cell_line("b", 2)]  # a second job starting over in the same directory
    (tmp_path / "decisions.csv").write_text(HEADER + "\r\n" + "".join(again))
    with pytest.raises(DecisionRecordError, match="steps that never go back"):
        read_decisions(tmp_path)


def test_the_per_rank_view_has_a_row_per_decision_and_rank(tmp_path: Path) -> None:
    record = DecisionFile(str(tmp_path), "r")
    record.record(lambda: row(1, (0.5, None), (True, None)))
    record.close()
    long = read_decisions(tmp_path, per_rank=True)
    assert list(long["rank"]) == [0, 1] and list(long["decision"]) == [0, 0]
    assert list(long["has_value"]) == [True, False] and long["vote"][0] == True and long["vote"].isna()[1]  # noqa: E712
    assert long["value"][0] == 0.5 and math.isnan(long["value"][1])
    assert set(long["step"]) == {1} and "values" not in long


FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none())


@settings(max_examples=25)
@given(st.lists(st.tuples(FLOATS, st.one_of(st.none(), st.booleans())), min_size=1, max_size=5))
def test_every_ranks_value_and_vote_reads_back_exactly(ranks: list[tuple[float | None, bool | None]]) -> None:
    values, votes = tuple(value for value, _ in ranks), tuple(vote for _, vote in ranks)
    with tempfile.TemporaryDirectory() as directory, warnings.catch_warnings():
        warnings.simplefilter("error")
        record = DecisionFile(directory, "r")
        record.record(lambda: row(1, values, votes))
        record.close()
        (got,) = read_decisions(directory)[["values", "votes"]].itertuples(index=False)
    assert got.votes == votes
    for read, sent in zip(got.values, values, strict=True):
        assert (read is None and sent is None) or (
            read is not None and sent is not None and (read == sent or (math.isnan(read) and math.isnan(sent)))
        )
