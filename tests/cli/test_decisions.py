"""``lightning-ext decisions LOG_DIR``: the story of a run from its decision record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ext.cli import main

HEADER = (
    "run,step,epoch,time,callback,monitor,mode,policy,world_size,outcome,values,votes,yes,agreed,saved_as,removed,"
    "best_before,best_after,best_path_before,best_path_after,reason"
)
ROWS = [  # as rank 0 writes them: an early-stopping check that improves, a save, a refusal, a stop
    "r1,10,0,2026-01-01T00:00:00+00:00,EarlyStopping,val_loss,min,any,2,go on,4.0 4.0,0 0,0,,,,inf,4.0,,,"
    "go on: no rank asked to stop (4.0 improved on its best inf); 'any' stops when one rank asks",
    "r1,10,0,2026-01-01T00:00:00+00:00,ModelCheckpoint,val_loss,min,all,2,saved,4.0 4.0,1 1,2,,/c/e0.ckpt,,,4.0,,"
    "/c/e0.ckpt,saved as e0.ckpt: every rank voted yes (its first score); 'all' needs every rank",
    "r1,20,1,2026-01-01T00:00:01+00:00,ModelCheckpoint,val_loss,min,all,2,not saved,3.0 nan,1 0,1,,,,4.0,4.0,"
    "/c/e0.ckpt,/c/e0.ckpt,not saved: rank 1 voted no (nan is not finite); 'all' needs every rank",
    "r1,20,1,2026-01-01T00:00:01+00:00,EarlyStopping,val_loss,min,any,2,stop,3.0 nan,0 1,1,,,,4.0,3.0,,,"
    '"stop: a non-finite value (nan on rank 1), and check_finite=True stops every rank whatever the policy"',
]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    (tmp_path / "decisions.csv").write_bytes(("\r\n".join([HEADER, *ROWS]) + "\r\n").encode())
    return tmp_path


def test_the_story_is_one_line_per_decision(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decisions", str(log_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{log_dir}: 4 decision(s) of 4, 2 rank(s), run r1"
    assert lines[1:] == [
        "epoch   0  step 10  EarlyStopping(val_loss)    go on: no rank asked to stop (4.0 improved on its best inf);"
        " 'any' stops when one rank asks",
        "epoch   0  step 10  ModelCheckpoint(val_loss)  saved as e0.ckpt: every rank voted yes (its first score); 'all'"
        " needs every rank",
        "epoch   1  step 20  ModelCheckpoint(val_loss)  not saved: rank 1 voted no (nan is not finite); 'all' needs"
        " every rank",
        "epoch   1  step 20  EarlyStopping(val_loss)    stop: a non-finite value (nan on rank 1), and check_finite=True"
        " stops every rank whatever the policy",
    ]


def test_one_callback_and_only_the_changes(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decisions", str(log_dir), "--callback", "modelcheckpoint"]) == 0
    assert [line.split()[5] for line in capsys.readouterr().out.splitlines()[1:]] == ["saved", "not"]
    assert main(["decisions", str(log_dir), "--only-changes"]) == 0
    # the refused save changed nothing; the improving check moved EarlyStopping's best from inf to 4.0
    assert [line.split()[5] for line in capsys.readouterr().out.splitlines()[1:]] == ["go", "saved", "stop:"]


def test_json_is_strict_and_csv_is_the_file_s_own_rows(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decisions", str(log_dir), "--format", "json", "--callback", "EarlyStopping"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [row["outcome"] for row in document] == ["go on", "stop"]
    assert document[0]["best_before"] == "inf" and document[1]["values"] == [3.0, None]  # NaN is null
    assert document[1]["votes"] == [False, True] and document[0]["saved_as"] is None and document[0]["agreed"] is None
    assert main(["decisions", str(log_dir), "--format", "csv", "--only-changes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [HEADER, ROWS[0], ROWS[1], ROWS[3]]


def test_errors_are_one_line_with_exit_code_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decisions", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(f"lightning-ext decisions: error: No decision record under {tmp_path}")
    (tmp_path / "decisions.csv").write_text(HEADER + "\r\n" + ROWS[0].replace(",4.0 4.0,", ",4.0,") + "\r\n")
    assert main(["decisions", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert "decisions.csv, line 2, column 'values': 1 entries for world size 2" in error and "Traceback" not in error
    (tmp_path / "decisions.csv").write_text(HEADER + "\r\n" + ROWS[0] + "\r\n" + ROWS[1][:30])
    assert main(["decisions", str(tmp_path)]) == 0
    assert "lightning-ext decisions: warning: " in capsys.readouterr().err  # the torn line


def test_the_command_loads_neither_lightning_nor_torch(log_dir: Path) -> None:
    code = (
        "import sys; from lightning_ext.cli import main; main(['decisions', sys.argv[1], '--format', 'csv']);"
        " print(sorted({'torch', 'lightning'} & {name.split('.')[0] for name in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(log_dir)], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"
