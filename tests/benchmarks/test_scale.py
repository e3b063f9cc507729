"""The scale benchmark (``python -m benchmarks.scale``): a smoke run end to end, as CI runs it.

Timings are not asserted (they depend on the machine); what the run must produce is: the three files, a row per
scale with both readers' times and the same values, a peak-memory figure, the summary's output, the writer rows,
and the counted file-system work of one writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.jobs import run_benchmark_smoke

pytestmark = (
    pytest.mark.ci
)  # benchmark smoke runs: minutes of start-up CPU on 2 cores, so make test leaves them to CI (make test-ci)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_smoke_run_writes_json_markdown_and_png(tmp_path: Path) -> None:
    run_benchmark_smoke("benchmarks.scale", tmp_path, timeout=240)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["scale-smoke.json", "scale-smoke.md", "scale-smoke.png"]
    assert (tmp_path / "scale-smoke.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    document = json.loads((tmp_path / "scale-smoke.json").read_text(encoding="utf-8"))
    assert [row["ranks"] for row in document["reader"]] == [4, 12]
    for row in document["reader"]:
        assert row["same_values"] is True
        assert set(row["wall_s"]) == {"plain pandas loop", "read_rank_metrics", "read_rank_metrics (pandas engine)"}
        assert row["memory"]["read_rank_metrics"]["frame_bytes"] > 0
    assert document["reader"][1]["table_rows"] == 11 * 300 + 150  # rank 7 stops at half the rows
    assert [row["ranks"] for row in document["summary"]] == [4, 12]
    assert "furthest from the median" in document["summary"][1]["text"]  # 12 ranks: the summary at scale
    assert document["start"]["heavy_imports"] == []
    assert [row["writers"] for row in document["writer"]] == [1, 2]
    local = document["file_system_work"]["local"]
    assert local["each later flush (100 rows appended)"] == {"write": 1}  # one write per flush, nothing else
    assert local["close"] == {"fsync": 1, "close": 1}
    markdown = (tmp_path / "scale-smoke.md").read_text(encoding="utf-8")
    assert "## Reading" in markdown and "## Writing" in markdown and "Load average" in markdown
