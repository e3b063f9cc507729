"""A rank killed with SIGKILL mid-run loses at most its unflushed rows and never leaves a torn row."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ext import read_rank_metrics

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_sigkilled_rank_keeps_every_flushed_row(tmp_path: Path) -> None:
    flush_every, kill_at = 7, 40  # 39 rows logged by then (this step's comes later); 35 flushed, 4 in memory
    process = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tests" / "helpers" / "scripts" / "killed_rank.py"),
            str(tmp_path),
            str(kill_at),
            str(flush_every),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    try:
        output, _ = process.communicate(timeout=150)
    except subprocess.TimeoutExpired:  # rank 0 may wait for its dead peer: end the whole job
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    killed = tmp_path / "killed.json"
    assert killed.is_file(), f"rank 1 never reached step {kill_at}:\n{output[-3000:]}"
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
