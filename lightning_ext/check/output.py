"""The check's output: ruff's text lines (``file:line:col: CODE message``), or JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable

from lightning_ext.check.codes import BY_CODE
from lightning_ext.check.findings import Finding

__all__ = ["as_json", "as_text"]


def as_text(findings: Iterable[Finding]) -> list[str]:
    """One line per finding, as ruff writes them.

    Example:
        >>> as_text([Finding("train.py", 18, 13, 18, 49, "LX101", "self.log('val_acc', sync_dist=True) ...", 17)])
        ["train.py:18:13: LX101 self.log('val_acc', sync_dist=True) ..."]

    """
    return [f"{finding.path}:{finding.line}:{finding.column}: {finding.code} {finding.message}" for finding in findings]


def as_json(findings: Iterable[Finding]) -> str:
    """The findings as a JSON list, one object each, with ruff's fields (``code``, ``message``, ``filename``,
    ``location``, ``end_location``) and the check's own: the kind's ``name``, the rank guard's line (``guard``, null
    for keys that depend on the rank) and the ``error`` lightning-ext's checks raise at run time."""
    return json.dumps(
        [
            {
                "code": finding.code,
                "name": BY_CODE[finding.code].name,
                "message": finding.message,
                "filename": finding.path,
                "location": {"row": finding.line, "column": finding.column},
                "end_location": {"row": finding.end_line, "column": finding.end_column},
                "guard": None if finding.guard_line is None else {"row": finding.guard_line},
                "error": BY_CODE[finding.code].error,
            }
            for finding in findings
        ],
        indent=2,
    )
