"""Crashes while writing per-rank metrics: SIGKILL mid-run (a writer, and a training rank), a crash at each stage of a
header rewrite, torn lines.

The hard crashes run in real processes (``tests/helpers/scripts/rank_writer.py`` and ``killed_rank.py``), each under a
deadline.
"""

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from lightning_ext import RankMetricsError, read_rank_metrics
from lightning_ext.rank_metrics import RankMetricsWriter, rank_metrics_path
from tests.helpers.jobs import server_ports
from tests.helpers.scripts.rank_writer import CRASH_CODE, CRASH_STAGES, FIRST_ROWS, expected_row

SCRIPTS = Path(__file__).resolve().parents[1] / "helpers" / "scripts"
SCRIPT = SCRIPTS / "rank_writer.py"
DEADLINE_S = 60


def read_quietly(log_dir: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a torn last line is allowed after SIGKILL
        return read_rank_metrics(log_dir)


@pytest.mark.timeout(DEADLINE_S)
def test_sigkill_mid_run_keeps_every_flushed_row_and_tears_none(tmp_path):
    path = Path(rank_metrics_path(tmp_path, 0))
    child = subprocess.Popen([sys.executable, str(SCRIPT), "loop", str(path), "7"], stdout=subprocess.PIPE)
    reports = b""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            # past the third header (names appear at rows 37 and 150), so rewrites and appends both happened
            while b"F 203\n" not in reports:
                assert selector.select(timeout=DEADLINE_S / 2), "the writer process reported nothing"
                chunk = os.read(child.stdout.fileno(), 65536)
                assert chunk, f"the writer process ended early: {child.wait()}"
                reports += chunk
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=DEADLINE_S / 2) == -signal.SIGKILL
        reports += child.stdout.read()  # what it wrote before dying is still in the pipe
    finally:
        child.kill()
        child.stdout.close()
    lines = reports.decode().splitlines()
    flushed = max(int(line[2:]) for line in lines if line.startswith("F "))
    logged = max(int(line[2:]) for line in lines if line.startswith("L ")) + 1
    table = read_quietly(tmp_path)
    assert flushed <= len(table) <= logged
    assert table["step"].tolist() == list(range(len(table)))
    for name in table.columns[3:]:
        expected = [expected_row(i).get(name, float("nan")) for i in range(len(table))]
        assert [repr(v) for v in table[name]] == [repr(v) for v in expected], name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        RankMetricsWriter(path, resume_from_step=len(table)).close()  # repairs a torn last line, if any
    assert path.read_bytes().endswith(b"\r\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read_rank_metrics(tmp_path)) == len(table)


@pytest.mark.slow
def test_sigkilled_rank_keeps_every_flushed_row(tmp_path: Path) -> None:
    flush_every, kill_at = 7, 40  # 39 rows logged by then (this step's comes later); 35 flushed, 4 in memory
    process = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPTS / "killed_rank.py"),
            str(tmp_path),
            str(kill_at),
            str(flush_every),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # a port below the ephemeral range (Lightning's own pick is an ephemeral one, which an outgoing connection of
        # another test can take before rank 0 binds it)
        env={
            **os.environ,
            "PYTHONWARNINGS": "ignore",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(server_ports(1)[0]),
        },
    )
    try:
        output, _ = process.communicate(timeout=240)  # within the 300 s test limit
    except subprocess.TimeoutExpired:  # rank 0 may wait for its dead peer: end the whole job
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    killed = tmp_path / "killed.json"
    assert killed.is_file(), f"rank 1 never reached step {kill_at}:\n{output[-12000:]}"  # both ranks' output
    report = json.loads(killed.read_text())
    assert report["logged"] == kill_at - 1
    assert report["flushed"] == (kill_at - 1) // flush_every * flush_every
    data = Path(report["path"]).read_bytes()
    assert data.endswith(b"\n"), "a torn row was left behind"
    table = read_rank_metrics(Path(report["path"]).parent.parent)
    rows = table[table["rank"] == 1]
    # every flushed row is on disk, nothing else; the loss is at most the unflushed window
    assert len(rows) == report["flushed"]
    assert report["logged"] - flush_every < len(rows) <= report["logged"]
    assert rows["rank_value"].tolist() == [1000.0 + step for step in range(len(rows))]


@pytest.mark.timeout(DEADLINE_S)
@pytest.mark.parametrize("stage", CRASH_STAGES)
def test_a_crash_at_any_stage_of_a_header_rewrite_loses_no_earlier_row(tmp_path, stage):
    path = Path(rank_metrics_path(tmp_path, 0))
    child = subprocess.run(
        [sys.executable, str(SCRIPT), "crash", stage, str(path)], capture_output=True, timeout=DEADLINE_S
    )
    assert child.returncode == CRASH_CODE, child.stderr.decode()
    leftovers = [name for name in os.listdir(path.parent) if name.endswith(".tmp")]
    assert bool(leftovers) == (stage != "after_replace")  # it died mid-rewrite
    table = read_rank_metrics(tmp_path)
    renamed = stage == "after_replace"
    assert table["step"].tolist() == list(range(FIRST_ROWS + renamed))
    assert table["loss"].tolist() == [float(i) for i in range(FIRST_ROWS + renamed)]
    assert ("acc" in table) == renamed
    with RankMetricsWriter(path, resume_from_step=FIRST_ROWS - 1) as writer:  # the run resumes and goes on
        writer.log_metrics({"loss": 10.0, "acc": 0.5}, step=FIRST_ROWS)
    assert read_rank_metrics(tmp_path)["step"].tolist() == list(range(FIRST_ROWS + 1))


def fail(*args: object) -> None:
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("stage", ["write", "fsync", "replace", "fsync_directory"])
def test_a_failed_header_rewrite_keeps_the_old_file_and_a_retry_writes_each_row_once(tmp_path, monkeypatch, stage):
    path = tmp_path / "metrics.csv"
    writer = RankMetricsWriter(path, flush_every_n_rows=100)
    for step in range(3):
        writer.log_metrics({"loss": float(step)}, step=step)
    writer.flush()
    before = path.read_bytes()
    writer.log_metrics({"loss": 3.0, "acc": 0.5}, step=3)
    with monkeypatch.context() as patch:
        if stage == "fsync_directory":  # after the rename: the new file is in place
            patch.setattr("lightning_ext._files.storage.fsync_directory", fail)
        else:
            patch.setattr(os, stage, fail)
        with pytest.raises(OSError, match="No space left"):
            writer.flush()
    assert [name for name in os.listdir(tmp_path) if name != "metrics.csv"] == []  # the temporary file is gone
    if stage == "fsync_directory":
        assert path.read_bytes() == b"acc,loss,step\r\n,0.0,0\r\n,1.0,1\r\n,2.0,2\r\n0.5,3.0,3\r\n"
    else:
        assert path.read_bytes() == before
    writer.close()
    assert path.read_bytes() == b"acc,loss,step\r\n,0.0,0\r\n,1.0,1\r\n,2.0,2\r\n0.5,3.0,3\r\n"


def test_a_failed_append_is_undone_and_a_retry_writes_each_row_once(tmp_path, monkeypatch):
    path = tmp_path / "metrics.csv"
    writer = RankMetricsWriter(path, flush_every_n_rows=100)
    writer.log_metrics({"loss": 0.0}, step=0)
    writer.flush()
    writer.log_metrics({"loss": 1.0}, step=1)
    real_write = os.write

    def half_then_fail(fd: int, data: bytes) -> int:
        real_write(fd, bytes(data[:3]))
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", half_then_fail)
        with pytest.raises(OSError):
            writer.flush()
    assert path.read_bytes() == b"loss,step\r\n0.0,0\r\n"  # no partial row for the next append to glue onto
    writer.close()
    assert path.read_bytes() == b"loss,step\r\n0.0,0\r\n1.0,1\r\n"


TORN = b"acc,loss,step\r\n0.5,1.0,0\r\n0.5,2.0,1\r\n0.5,3."


def test_the_reader_skips_a_torn_last_line_with_a_warning_naming_the_file(tmp_path):
    path = Path(rank_metrics_path(tmp_path, 0))
    path.parent.mkdir()
    path.write_bytes(TORN)
    with pytest.warns(RuntimeWarning, match=re.escape(f"{path}, line 4: ignored an incomplete last line")):
        table = read_rank_metrics(tmp_path)
    assert table["step"].tolist() == [0, 1] and table["loss"].tolist() == [1.0, 2.0]
    path.write_bytes(b"acc,lo")  # even the header was cut short: a rank without rows
    with pytest.warns(RuntimeWarning, match="incomplete last line"):
        assert read_rank_metrics(tmp_path).empty


def test_the_writer_repairs_a_torn_last_line_when_it_resumes(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_bytes(TORN)
    with pytest.warns(RuntimeWarning, match=re.escape(f"{path}: removed an incomplete last line")):
        writer = RankMetricsWriter(path, resume_from_step=10)
    assert writer.rows_written == 2
    writer.log_metrics({"loss": 3.0, "acc": 0.5}, step=2)
    writer.close()
    assert path.read_bytes() == b"acc,loss,step\r\n0.5,1.0,0\r\n0.5,2.0,1\r\n0.5,3.0,2\r\n"


def test_a_torn_header_is_refused_rather_than_guessed(tmp_path):
    path = Path(rank_metrics_path(tmp_path, 0))
    path.parent.mkdir()
    path.write_bytes(b'"acc\nloss",st')  # cut right after a newline inside a quoted name
    message = re.escape(f"{path}, line 1: unreadable header")
    with pytest.warns(RuntimeWarning), pytest.raises(RankMetricsError, match=message):
        read_rank_metrics(tmp_path)
