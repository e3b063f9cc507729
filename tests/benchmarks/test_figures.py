"""The figures the README and the docs quote are the results file's, and the docs name only what exists."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from benchmarks.comm.figures import _STEP_ROWS, BLOCK, FIGURES, RESULTS, load, quoting, rendered, stale
from benchmarks.comm.row_cost import Spread

REPO = Path(__file__).resolve().parents[2]


def test_every_quoted_figure_is_the_results_files() -> None:
    assert not stale(), "run `python -m benchmarks.comm.figures --update-docs`"


# The figures in µs that no results file holds, each measured once for the decision its page explains: the page says
# "about" and what was timed. Any other figure in µs outside a figure block is a defect.
ONE_OFF = {
    ("docs/hang-checks.md", "about 80 µs per check"): "why the exchange makes no torch tensor (a past design's cost)",
    ("docs/internals.md", "about 30 µs per record"): "why the decision record does not write through fsspec",
    ("docs/internals.md", "about 85 µs here"): "why the memory is read at most once a second",
    ("docs/internals.md", "about 10 µs of CPU per backward pass"): "the step timer's autograd callbacks",
    ("docs/per-rank-metrics.md", "about 146 µs on one"): "stock's TensorBoardLogger, timed once for scale",
    ("benchmarks/README.md", "about 1 µs per"): "the seams' dispatch, left out of the measured cost",
    # the logger sinks' cost, from a trimmed comm run under load that no results file holds (the page says so)
    ("docs/per-rank-metrics.md", "MLflow child run 118 µs"): "a row with its MLflow child run",
    ("docs/per-rank-metrics.md", "W&B run 94 µs"): "a row with its W&B run",
    ("docs/per-rank-metrics.md", "1.6 µs per row on the training thread"): "W&B's run.log, timed in one process",
    ("docs/internals.md", "40 µs per row in batches of 100"): "MLflow's file store, timed in one process",
    # a published measurement the model of issue 39 is compared with, cited, not measured here
    ("docs/hang-checks.md", "40-47 µs at a few hosts"): "nccl-tests' 8-byte all_reduce across hosts (nccl-tests#182)",
}


def test_the_readme_and_the_docs_quote_the_results_through_figure_blocks() -> None:
    names = {m.group("name") for path in quoting() for m in BLOCK.finditer(path.read_text("utf-8"))}
    assert names == set(FIGURES), sorted(names ^ set(FIGURES))  # every figure quoted, none unknown
    typed = []
    for path in quoting():
        page = path.relative_to(REPO).as_posix()
        text = path.read_text("utf-8")
        prose = " ".join(re.sub(r"```.*?```", "", BLOCK.sub("", text), flags=re.DOTALL).split())  # no block, no code
        for where, words in ONE_OFF:
            prose = prose.replace(words, "") if where == page else prose
        typed += [f"{page}: {found!r}" for found in re.findall(r"\d[\d.,-]* ?µs(?: \S+){0,4}", prose)]
    assert not typed, f"figures in µs not written from a results file (quote them through a figure block): {typed}"
    assert {page for page, _ in ONE_OFF} <= {path.relative_to(REPO).as_posix() for path in quoting()}


def test_missed_is_said_as_missed_from_each_target_and_a_changed_result_makes_the_docs_stale() -> None:
    results = load()
    readme = (REPO / "README.md").read_text("utf-8")
    rows = [(what, subject) for what, subject, words in _STEP_ROWS if words is not None]
    assert len(rows) >= 5
    for what, subject in rows:  # the README's table says each target's own verdict, met or missed
        target = results.target(f"training_step/{subject}")
        row = next(line for line in readme.splitlines() if line.startswith(f"| {what} |"))
        assert row.endswith(f"{target.verdict()} |") and ("**missed**" in row) == (not target.met), row
        flipped = dataclasses.replace(
            results, targets=[dataclasses.replace(t, met=not t.met) if t is target else t for t in results.targets]
        )
        changed = next(line for line in rendered(readme, flipped).splitlines() if line.startswith(f"| {what} |"))
        assert ("**missed**" in changed) == target.met, changed
    checks = [results.target(f"training_step/{subject}") for subject in ("hang_checks", "hang_checks_5_synced")]
    verdict = FIGURES["checks-verdict"](results)
    assert (" is **missed**," in verdict) == (not all(target.met for target in checks)), verdict
    cost = results.costs[0]
    changed_cost = dataclasses.replace(results, costs=[dataclasses.replace(cost, row_cpu_us=Spread(99.0, 98.0, 100.0))])
    assert rendered(readme, changed_cost) != readme and "99.0 µs" in rendered(readme, changed_cost)
    with pytest.raises(KeyError):
        rendered("<!-- figure:no-such-figure -->x<!-- /figure -->", results)


def test_the_scale_figures_in_the_docs_are_the_scale_results_files() -> None:
    """docs/per-rank-metrics.md quotes the scale benchmark's results file: a changed writer run changes the page."""
    results = load()
    assert results.scale is not None
    page = (REPO / "docs" / "per-rank-metrics.md").read_text("utf-8")
    writers = [dict(run) for run in results.scale["writer"]]
    walls = [f"{run['row_wall_us']:#.3g} µs at {run['writers']}" for run in writers]
    assert all(wall in page for wall in walls), walls  # each writer count's wall time, as the results file has it
    writers[0]["row_wall_us"] = 9.99
    changed = dataclasses.replace(results, scale={**results.scale, "writer": writers})
    assert "9.99 µs at 1 writer" in rendered(page, changed) and rendered(page, changed) != page


def test_the_results_markdown_is_written_from_the_json() -> None:
    assert RESULTS.with_suffix(".md").read_text("utf-8") == load().markdown()


_NAMED = re.compile(r"`((?:lightning_ext|benchmarks)(?:\.\w+)+)(?:\([^`]*\))?`")


@pytest.mark.parametrize(
    "page",
    [
        "README.md",
        "benchmarks/README.md",
        "patches/README.md",
        *sorted(path.relative_to(REPO).as_posix() for path in (REPO / "docs").glob("*.md")),
    ],
)
def test_every_module_and_function_the_docs_name_exists(page: str) -> None:
    missing = []
    for name in _NAMED.findall((REPO / page).read_text("utf-8")):
        parts = name.split(".")
        if re.fullmatch(r"[A-Z]", parts[-1]):  # a placeholder: `lightning_ext.X`
            continue
        for end in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module(".".join(parts[:end]))
            except ImportError:
                continue
            break
        for attribute in parts[end:]:
            found = getattr(found, attribute, None)
        if found is None:
            missing.append(name)
    assert not missing, f"{page} names what does not exist: {missing}"
