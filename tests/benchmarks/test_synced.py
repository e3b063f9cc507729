"""The synced-logging benchmark runs (smoke), counts what stock and lightning-ext call per step, and writes its files.

Its timings are not judged here (speed belongs to the full run); the counts (calls and host-device synchronizations
per step) are exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = (
    pytest.mark.ci
)  # benchmark smoke runs: minutes of start-up CPU on 2 cores, so make test leaves them to CI (make test-ci)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smoke_counts_one_packed_all_reduce_where_stock_makes_two_calls_per_value(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.synced", "--smoke", "--world-sizes", "2", "--values", "1", "5"]
    run = subprocess.run(
        [*command, "--out", str(tmp_path), "--machine", "m"], cwd=REPO, capture_output=True, text=True, timeout=540
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    document = json.loads((tmp_path / "synced-m.json").read_text())
    calls = {(row["config"], row["values"]): row["calls"] for row in document["rows"]}
    syncs = {(row["config"], row["values"]): row["host_syncs"] for row in document["rows"]}
    for values in (1, 5):
        # stock: _sync_ddp's barrier and all-reduce per value, and the SIGTERM flag's broadcast
        stock = {"all_reduce": values, "barrier": values, "broadcast": 1}
        assert calls["stock", values] == calls["stock_twin", values] == stock
        assert calls["defaults", values] == {"all_reduce": 1, "check": 1}  # one check, then one packed all-reduce
        assert calls["per_value", values] == {"all_reduce": values, "check": values}  # stock's sync, checked
        assert calls["unchecked", values] == {"all_reduce": 1}
        # the loggers read every logged value back (.item()) alike; stock also reads its SIGTERM flag back every step
        assert syncs["stock", values] == syncs["defaults", values] + 1 == syncs["unchecked", values] + 1
    assert {(t["name"], t["where"]) for t in document["targets"]} == {
        (name, f"W=2, {values} synced value(s)")
        for name in ("step time vs stock", "training-group calls per step")
        for values in (1, 5)
    }
    page = (tmp_path / "synced-m.md").read_text()
    assert page.startswith("# Synced logging: coalesced against stock (m, ") and "| 2 | 5 | `defaults` |" in page
