"""The check's benchmark (``python -m benchmarks.check``): a smoke run, with Lightning's examples and tests absent and
present (extracted by ``python -m benchmarks.check.sources`` from a git repository made here).

Timings are not judged here (speed belongs to the full run); what the run must produce is: its two files, every part
with its files, the whole set's findings, and the target judged only over the whole set.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = (
    pytest.mark.ci
)  # benchmark smoke runs: minutes of start-up CPU on 2 cores, so make test leaves them to CI (make test-ci)

REPO = Path(__file__).resolve().parents[2]


def _benchmark(tmp_path: Path, sources: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "LIGHTNING_SOURCES": str(sources)},
        check=False,
    )


def test_without_lightnings_examples_and_tests_it_times_the_rest_and_judges_nothing(tmp_path: Path) -> None:
    run = _benchmark(
        tmp_path, tmp_path / "none", "benchmarks.check", "--smoke", "--out", str(tmp_path), "--machine", "m"
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "not found under" in run.stdout and "examples, tests/tests_pytorch" in run.stdout
    document = json.loads((tmp_path / "check-m.json").read_text())
    assert set(document["parts"]) == {"installed lightning", "installed pytorch_lightning"}
    assert all(part["files"] > 100 for part in document["parts"].values())
    assert document["target"] == {"limit_s": 10.0, "missing": ["examples", "tests/tests_pytorch"], "met": None}
    assert len(document["wall_s"]) == len(document["cpu_s"]) == 1
    assert "not judged (missing: examples, tests/tests_pytorch)" in (tmp_path / "check-m.md").read_text()


def test_extracted_sources_are_checked_and_their_finding_reported(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    (clone / "examples").mkdir(parents=True)
    (clone / "tests" / "tests_pytorch").mkdir(parents=True)
    (clone / "examples" / "train.py").write_text((REPO / "tests/check/corpus/barrier_training_step.py").read_text())
    (clone / "tests" / "tests_pytorch" / "test_it.py").write_text("def test_nothing():\n    pass\n")
    (clone / "README.md").write_text("not extracted\n")
    git = ["git", "-C", str(clone), "-c", "user.email=t@t", "-c", "user.name=t"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "sources"], ["tag", "9.9.9"]):
        subprocess.run([*git, *command], check=True, capture_output=True)
    sources = tmp_path / "sources"
    extract = ["benchmarks.check.sources", "--git-dir", str(clone / ".git"), "--ref", "9.9.9"]
    run = _benchmark(tmp_path, sources, *extract)
    assert run.returncode == 0, run.stderr
    assert sorted(str(p.relative_to(sources)) for p in sources.rglob("*") if p.is_file()) == [
        "SOURCE.json",
        "examples/train.py",
        "tests/tests_pytorch/test_it.py",
    ]
    run = _benchmark(tmp_path, sources, "benchmarks.check", "--smoke", "--out", str(tmp_path), "--machine", "m")
    assert run.returncode == 0, run.stdout + run.stderr
    document = json.loads((tmp_path / "check-m.json").read_text())
    assert document["metadata"]["sources"]["ref"] == "9.9.9"
    assert document["parts"]["examples"]["files"] == document["parts"]["examples"]["findings"] == 1
    assert [(Path(f["filename"]).name, f["code"]) for f in document["findings"]] == [("train.py", "LX203")]
    assert document["target"]["missing"] == [] and isinstance(document["target"]["met"], bool)
    missing = _benchmark(
        tmp_path, sources, "benchmarks.check.sources", "--git-dir", str(clone / ".git"), "--ref", "1.0"
    )
    assert missing.returncode != 0 and "'1.0' is not in" in missing.stderr and "(pass --ref)" in missing.stderr


def test_the_docs_quote_the_committed_results() -> None:
    """docs/check.md's figures over Lightning's code are those of benchmarks/results/check-cpu-2core-x86_64.json."""
    document = json.loads((REPO / "benchmarks/results/check-cpu-2core-x86_64.json").read_text())
    page = " ".join((REPO / "docs" / "check.md").read_text().split())
    files = sum(part["files"] for part in document["parts"].values())
    wall, cpu = document["median_s"], statistics.median(document["cpu_s"])
    quoted = (
        f"**{len(document['findings'])} findings in {files} files, in {wall:.2f} s (median wall clock of"
        f" {len(document['wall_s'])} runs, each a fresh `python -m lightning_ext.check` process; {cpu:.2f} s of CPU)"
        f" on this 2-core machine, with a load average of {round(document['metadata']['load_average_before'][0])}"
    )
    assert quoted in page
    for name, part in document["parts"].items():
        assert f"| {part['files']} | {part['findings']} |" in page, name
    assert document["target"] == {"limit_s": 10.0, "missing": [], "met": True}
