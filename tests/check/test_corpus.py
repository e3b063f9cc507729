"""The check over its corpus (tests/check/corpus): exactly the findings each program states inline, no others.

Each program marks every line that must be found with ``# expect: CODE`` (a line may carry several); a program with
no mark must produce no finding. The expectations are written by hand, from what each program does at run time
(tests/check/test_agreement.py runs the programs whose kind the hang checks name, and compares).
"""

from __future__ import annotations

import re
from pathlib import Path

from lightning_ext.check import check_paths
from tests.helpers.check_corpus import CORPUS, expected_findings, programs


def test_the_corpus_has_forty_programs_and_fifteen_correct_ones() -> None:
    every = programs()
    correct = [path for path in every if not expected_findings(path)]
    assert len(every) >= 40, len(every)
    assert len(correct) >= 15, correct


def test_the_check_finds_exactly_what_each_program_states() -> None:
    checked = check_paths([CORPUS])
    assert checked.errors == []
    assert checked.files == len(programs())
    found = {(Path(finding.path).name, finding.line, finding.code) for finding in checked.findings}
    expected = {(path.name, line, code) for path in programs() for line, code in expected_findings(path)}
    assert sorted(found - expected) == [], "found, not expected"
    assert sorted(expected - found) == [], "expected, not found"


def test_every_kind_and_every_guard_form_is_in_the_corpus() -> None:
    codes = {code for path in programs() for _, code in expected_findings(path)}
    assert codes == {"LX101", "LX102", "LX103", "LX201", "LX202", "LX203", "LX204", "LX205"}
    text = "\n".join(path.read_text() for path in programs() if expected_findings(path))
    forms = {
        "is_global_zero": r"if .*is_global_zero",
        "global_rank": r"if .*global_rank",
        "local_rank": r"if .*local_rank",
        "node_rank": r"if .*node_rank",
        "rank_zero_only": r"@rank_zero_only",
        "get_rank()": r"if .*get_rank\(\) == 0",
        'os.environ["RANK"]': r'os\.environ\["RANK"\]',
        "LOCAL_RANK": r'os\.environ\.get\("LOCAL_RANK"',
        "else": r"else:\n.*# expect",
        "early return": r"!= 0:\n\s+return",
        "continue": r"continue\n.*# expect",
        "nested function": r"def report\(",
        "trainer alias": r"trainer = self\.trainer",
        "guard alias": r"is_zero = self\.trainer\.is_global_zero",
    }
    missing = [form for form, pattern in forms.items() if not re.search(pattern, text)]
    assert not missing, missing


def test_the_pitfall_matrix_scripts_pitfalls_are_found_on_their_lines() -> None:
    """The launched pitfall matrix (tests/checks/test_pitfall_matrix.py) asserts that the runtime error names each
    ``# pitfall: <call>`` line of its script, in every hook at 2, 3 and 4 ranks: the check names the same lines."""
    script = Path(__file__).resolve().parents[1] / "helpers" / "scripts" / "pitfall_matrix.py"
    codes = {
        "keys": "LX103",
        "log": "LX101",
        "metric": "LX102",
        "log_dir": "LX201",
        "save_checkpoint": "LX202",
        "barrier": "LX203",
        "broadcast": "LX203",
        "all_gather": "LX204",
        "all_reduce": "LX205",
        "all_gather_single": "LX205",
    }
    marked = {
        (number, codes[match.group(1)])
        for number, line in enumerate(script.read_text().splitlines(), 1)
        if (match := re.search(r"# pitfall: (\w+)$", line))
    }
    assert len(marked) == len(codes)
    assert {(finding.line, finding.code) for finding in check_paths([script]).findings} == marked
