"""A finding, where it is, and the ``# noqa`` comments that silence one line's findings (all, or those named)."""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass

__all__ = ["Finding", "silenced"]

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Finding:
    """One finding of the check.

    Attributes:
        path: the file, as given (or found under a folder given).
        line: the call's line, from 1.
        column: the call's column, from 1.
        end_line: the line where the call ends.
        end_column: the column after the call's end, from 1.
        code: its kind's code (``lightning_ext.check.codes``).
        message: what the call is, where its guard is, what happens at run time, and the fix.
        guard_line: the line of the rank guard (``None`` for keys that depend on the rank).

    """

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    code: str
    message: str
    guard_line: int | None


def silenced(source: str, findings: list[Finding]) -> list[Finding]:
    """``findings`` without those a ``# noqa`` comment on their line silences: ``# noqa`` all of them,
    ``# noqa: LX101, LX203`` those codes.

    Example:
        >>> finding = Finding("a.py", 1, 1, 1, 9, "LX203", "...", 1)
        >>> silenced("x = 1  # noqa: LX203\\n", [finding]), silenced("x = 1  # noqa: LX101\\n", [finding]) == [finding]
        ([], True)

    """
    if not findings:
        return findings
    comments: dict[int, str] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.string
    except (tokenize.TokenError, SyntaxError):  # the file parsed: this cannot happen but at its very end
        pass
    kept = []
    for finding in findings:
        match = _NOQA.search(comments.get(finding.line, ""))
        if match is None:
            kept.append(finding)
            continue
        codes = match.group("codes")
        if codes is not None and finding.code not in re.split(r"[\s,]+", codes.upper()):
            kept.append(finding)
    return kept
