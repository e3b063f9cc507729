"""``lightning-ext ranks`` beyond 8 ranks: text, JSON and CSV summaries, options, bad input, mixed runs, start-up.

The files are written here in the documented format; expected figures are computed with NumPy from the values
written, never with lightning_ext.
"""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lightning_ext.cli import main

REPO = Path(__file__).resolve().parents[2]
RANKS, STEPS = 20, 6


def loss(rank: int, step: int) -> float:
    """Rank 3 is far above the others at the end; the others spread evenly."""
    return 10.0 - step + (50.0 if rank == 3 and step == STEPS - 1 else rank / 100)


def write(log_dir: Path, rank: int, rows: list[str], header: str = "loss,lr,step") -> Path:
    path = log_dir / f"rank_{rank}" / "metrics.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(line + "\r\n" for line in [header, *rows]).encode())
    return path


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    for rank in range(RANKS):
        write(tmp_path, rank, [f"{loss(rank, step)!r},0.1,{step}" for step in range(STEPS)])
    return tmp_path


def last_losses() -> np.ndarray:
    return np.array([loss(rank, STEPS - 1) for rank in range(RANKS)])


def test_text_summary_at_scale(log_dir, capsys):
    assert main(["ranks", str(log_dir), "--top", "2"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert err == "" and lines[0] == f"{log_dir}: {RANKS} rank(s), {RANKS * STEPS} row(s), 2 metric(s)"
    stated = (  # what the robust z is, as computed below and in docs/per-rank-metrics.md's prose
        "each rank's last value; robust z = 0.6745 (value - median) / MAD, MAD the median of |value - median|; when MAD"
        " is 0, 0.7979 (value - median) / mean(|value - median|); * marks |z| > 3.5"
    )
    assert lines[1] == stated
    assert stated in (Path(__file__).parents[2] / "docs" / "per-rank-metrics.md").read_text()  # shown as printed
    assert lines[2].split() == ["metric", "ranks", "min", "median", "max", "spread", "MAD", "z", "scale"]
    values = last_losses()
    median = np.median(values)
    mad = np.median(np.abs(values - median))
    stats = [f"{x:.6g}" for x in (values.min(), median, values.max(), values.max() - values.min(), mad)]
    assert lines[3].split() == ["loss", str(RANKS), *stats, "MAD"]
    assert lines[4].split() == ["lr", str(RANKS), "0.1", "0.1", "0.1", "0", "0", "none"]
    assert lines[5] == "furthest from the median (at most 2 per metric):"
    z = 0.6745 * (values - median) / mad
    first, second = np.argsort(-np.abs(z), kind="stable")[:2]
    assert lines[7].split() == ["loss", str(first), f"{values[first]:.6g}", str(STEPS - 1), f"{z[first]:+.3g}", "*"]
    assert lines[8].split()[:2] == ["loss", str(second)] and len(lines) == 9  # lr: every rank agrees


def test_json_summary(log_dir, capsys):
    assert main(["ranks", str(log_dir), "--format", "json", "--top", "1"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["ranks"], document["rows"], document["value"]) == (RANKS, RANKS * STEPS, "last")
    values = last_losses()
    (loss_entry,) = [entry for entry in document["metrics"] if entry["metric"] == "loss"]
    assert loss_entry["median"] == np.median(values) and loss_entry["max"] == values.max()
    median = np.median(values)
    z = 0.6745 * (values[3] - median) / np.median(np.abs(values - median))
    assert loss_entry["furthest"] == [{"rank": 3, "value": values[3], "step": STEPS - 1, "robust_z": pytest.approx(z)}]
    assert "skipped" not in document and document["incomplete"] == []


def test_csv_summary_is_exact(log_dir, capsys):
    assert main(["ranks", str(log_dir), "--format", "csv", "--top", "1", "--metric", "loss"]) == 0
    (row,) = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    values = last_losses()
    assert float(row["median"]) == np.median(values) and row["missing_ranks"] == ""
    assert (row["furthest_1_rank"], float(row["furthest_1_value"])) == ("3", values[3])


def test_step_ranks_and_top(log_dir, capsys):
    assert main(["ranks", str(log_dir), "--step", "2", "--ranks", "0-9,15", "--metric", "loss"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # 11 ranks: the summary at scale; only the rows at step 2 were read
    assert lines[0] == f"{log_dir}: 11 rank(s), 11 row(s), 1 metric(s)"
    assert lines[1].startswith("each rank's value at step 2;")
    values = np.array([loss(rank, 2) for rank in [*range(10), 15]])
    assert lines[3].split()[1:4] == ["11", f"{values.min():.6g}", f"{np.median(values):.6g}"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--step", "two"], "argument --step: expected 'last' or a step (a whole number), got 'two'"),
        (["--top", "0"], "argument --top: expected a whole number >= 1, got '0'"),
        (["--ranks", "5-2"], "argument --ranks: expected ranks such as 0-511,600, got '5-2'"),
        (["--format", "xml"], "argument --format: invalid choice: 'xml'"),
    ],
)
def test_bad_options_are_usage_errors(log_dir, capsys, arguments, message):
    with pytest.raises(SystemExit) as exited:
        main(["ranks", str(log_dir), *arguments])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_bad_files_are_skipped_and_listed_with_why(log_dir, capsys):
    (log_dir / "rank_4" / "metrics.csv").unlink()  # missing
    write(log_dir, 5, [], header="")  # empty: no header, no rows
    (log_dir / "rank_5" / "metrics.csv").write_bytes(b"")
    torn = write(log_dir, 6, ["1.0,0.1,0", "2.0,0.1,1"])
    with torn.open("ab") as handle:
        handle.write(b"3.0,0.")  # cut short
    bad = write(log_dir, 7, ["1.0,0.1"], header="loss,lr,stp")  # another header: no step column
    short = write(log_dir, 8, ["1.0,0.1,0", "9.0,0"])  # a row cut to two fields
    assert main(["ranks", str(log_dir)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    # 16 ranks with rows: 20, less rank 4 (no file), 5 (no rows), 7 and 8 (skipped); 15 x 6 rows and rank 6's 2
    assert lines[0] == f"{log_dir}: 16 rank(s), 92 row(s), 2 metric(s), skipped: ranks 7 and 8"
    assert f"skipped: rank 7 ({bad}, line 1: the header has no 'step' column); rank 8 ({short}, line 3:" in out
    assert "missing: rank 4 (no file)" in lines
    assert "without rows: rank 5 (empty file)" in lines
    assert "behind (the other ranks reach step 5): rank 6 (last step 1)" in lines
    assert err == f"lightning-ext ranks: warning: {torn}, line 4: ignored an incomplete last line (a write cut short)\n"


def test_files_of_another_run_are_refused_with_their_names(log_dir, capsys):
    os.rename(log_dir / "rank_0" / "metrics.csv", log_dir / "rank_0" / "metrics.csv.1")
    write(log_dir, 0, ["1.0,0.1,0"])
    assert main(["ranks", str(log_dir)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"lightning-ext ranks: error: {log_dir} holds files of more than one run: ")
    assert f"rank 0 has earlier runs' files up to .1 ({log_dir / 'rank_0' / 'metrics.csv.1'})" in err
    assert f"ranks 1-19 have none, so their files may be an earlier run's ({log_dir / 'rank_1' / 'metrics.csv'}" in err
    assert main(["ranks", str(log_dir), "--allow-mixed"]) == 0
    assert "earlier runs' files (ignored): rank 0 (" in capsys.readouterr().out
    assert main(["ranks", str(log_dir), "--ranks", "1-19"]) == 0


def test_nothing_readable_is_an_error(tmp_path, capsys):
    write(tmp_path, 0, ["1,2"], header="loss,lr")
    assert main(["ranks", str(tmp_path)]) == 1
    assert capsys.readouterr().err.endswith(f"error: No rank's file could be read under {tmp_path}\n")


@pytest.mark.timeout(120)
def test_the_command_starts_without_lightning_or_torch(log_dir):
    """In a fresh interpreter: the whole command, then which modules it imported (how fast it starts is measured by
    ``python -m benchmarks.scale``, not judged here: a loaded machine would fail a time limit without a defect)."""
    script = (
        "import sys\n"
        "from lightning_ext.cli import main\n"
        f"code = main(['ranks', {str(log_dir)!r}, '--format', 'json'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', 'matplotlib', 'psutil'))\n"
        "print(code, heavy, file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    code, heavy = process.stderr.split(" ", 1)
    assert (code, heavy.strip()) == ("0", "[]"), process.stderr


@pytest.mark.timeout(120)
def test_a_closed_pipe_ends_the_command_quietly(log_dir):
    """``lightning-ext ranks DIR | head -1``: the reader went away before the output; no traceback, no error line."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the command writes, so its first write meets a broken pipe
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        command = [sys.executable, "-m", "lightning_ext", "ranks", str(log_dir), "--format", "json"]
        process = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    finally:
        os.close(write_end)
    assert process.returncode == 1
    assert process.stderr == ""
