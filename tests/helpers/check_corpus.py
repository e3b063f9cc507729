"""The static check's corpus (tests/check/corpus): its programs and the findings each states inline."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[1] / "check" / "corpus"
_EXPECT = re.compile(r"# expect: (LX\d{3})")


def programs() -> list[Path]:
    """Every program of the corpus, by name."""
    return sorted(CORPUS.glob("*.py"))


def expected_findings(path: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each ``# expect: CODE`` mark of a program."""
    return [
        (number, code)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for code in _EXPECT.findall(line)
    ]


def run_settings(path: Path) -> dict[str, Any] | None:
    """A program's ``RUN`` (how tests/helpers/scripts/check_programs.py runs it), ``None`` if it has none."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(target, "id", None) for target in node.targets] == ["RUN"]:
            value: dict[str, Any] = ast.literal_eval(node.value)
            return value
    return None
