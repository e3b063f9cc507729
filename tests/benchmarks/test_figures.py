"""The figures the README and the docs quote are the results file's, and the docs name only what exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from benchmarks.comm.figures import BLOCK, FIGURES, RESULTS, load, quoting, rendered, stale

REPO = Path(__file__).resolve().parents[2]


def test_every_quoted_figure_is_the_results_files() -> None:
    assert not stale(), "run `python -m benchmarks.comm.figures --update-docs`"


def test_the_readme_and_the_docs_quote_the_results_through_figure_blocks() -> None:
    names = {m.group("name") for path in quoting() for m in BLOCK.finditer(path.read_text("utf-8"))}
    assert names == set(FIGURES), sorted(names ^ set(FIGURES))  # every figure quoted, none unknown
    readme = (REPO / "README.md").read_text("utf-8")
    prose = re.sub(r"```.*?```", "", BLOCK.sub("", readme), flags=re.DOTALL)  # outside the blocks and code examples
    assert not re.findall(r"\d[\d.,-]* ?µs", prose), "a figure in µs that is not written from the results file"


def test_a_changed_result_makes_the_docs_stale_and_missed_is_said_as_missed(tmp_path: Path) -> None:
    results = load()
    readme = (REPO / "README.md").read_text("utf-8")
    telemetry = results.target("training_step/telemetry")
    assert not telemetry.met  # the results file says missed: so does the README's table
    row = next(line for line in readme.splitlines() if line.startswith("| training step, telemetry at every step"))
    assert "**missed**" in row and "not settled" not in row, row
    cost = results.costs[0]
    changed = type(results)(
        results.metadata,
        results.rows,
        results.targets,
        [type(cost)(**{**cost.__dict__, "row_cpu_us": type(cost.row_cpu_us)(99.0, 98.0, 100.0)})],
        results.syncs,
        results.records,
        results.stalls,
        results.synced,
    )
    assert rendered(readme, changed) != readme and "99.0 µs" in rendered(readme, changed)
    with pytest.raises(KeyError):
        rendered("<!-- figure:no-such-figure -->x<!-- /figure -->", results)


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
