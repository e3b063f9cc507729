"""Apply (or reverse) the hunks of one file in memory: exact context, no fuzz, an offset allowed.

Each hunk's expected lines must match the file exactly, line endings included. A hunk is looked for at its stated
line first (shifted by the offset the previous hunk of the file was found at), then ever farther away, after the
previous hunk and without overlapping it. A hunk that does not match forwards is checked backwards: if its result is
there instead, it is already applied.

Example:
    >>> hunk = HunkSpec(header="@@ -1,2 +1,3 @@", source_start=1, target_start=1, old=("a\\n", "b\\n"),
    ...                 new=("a\\n", "x\\n", "b\\n"))
    >>> lines, (outcome,) = patch_lines(["# new first line\\n", "a\\n", "b\\n"], (hunk,), reverse=False)
    >>> lines, outcome.status, outcome.offset
    (['# new first line\\n', 'a\\n', 'x\\n', 'b\\n'], <HunkStatus.OK: 'OK'>, 1)
    >>> patch_lines(lines, (hunk,), reverse=False)[1][0].status
    <HunkStatus.ALREADY_APPLIED: 'ALREADY APPLIED'>

"""

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_ext.patches._report import HunkStatus, Mismatch
from lightning_ext.patches._series import HunkSpec

__all__ = ["HunkOutcome", "patch_lines"]


@dataclass(frozen=True)
class HunkOutcome:
    """What happened to one hunk: its status, the offset it was found at, and for a failure the first mismatch."""

    status: HunkStatus
    offset: int = 0
    mismatch: Mismatch | None = None


def patch_lines(
    lines: Sequence[str], hunks: Sequence[HunkSpec], *, reverse: bool
) -> tuple[list[str], list[HunkOutcome]]:
    """Apply ``hunks`` (or undo them, with ``reverse``) to a file's lines.

    Args:
        lines: the file, as :func:`~lightning_ext.patches._series.split_lines` gives it.
        hunks: one file's hunks, in patch order.
        reverse: undo the hunks (expect their new lines, restore their old ones).

    Returns:
        The new lines (with every ``OK`` hunk applied and the others left alone) and one outcome per hunk: ``OK``
        (with the offset it was found at), ``ALREADY_APPLIED`` (its result is there instead), or ``FAILS``.

    """
    result: list[str] = []
    outcomes: list[HunkOutcome] = []
    cursor = 0  # lines before the cursor are settled: no later hunk may match there
    previous_offset = 0
    for hunk in hunks:
        old, new = (hunk.new, hunk.old) if reverse else (hunk.old, hunk.new)
        start, other_start = (
            (hunk.target_start, hunk.source_start) if reverse else (hunk.source_start, hunk.target_start)
        )
        stated = _index(start, old)
        found = _find(lines, old, center=stated + previous_offset, low=cursor)
        if found is not None:
            result.extend(lines[cursor:found])
            result.extend(new)
            cursor = found + len(old)
            previous_offset = found - stated
            outcomes.append(HunkOutcome(HunkStatus.OK, offset=found - stated))
            continue
        there = _find(lines, new, center=_index(other_start, new) + previous_offset, low=cursor)
        if there is not None:
            result.extend(lines[cursor : there + len(new)])
            cursor = there + len(new)
            outcomes.append(HunkOutcome(HunkStatus.ALREADY_APPLIED))
            continue
        mismatch = _first_mismatch(lines, old, at=min(max(stated + previous_offset, cursor), len(lines)))
        outcomes.append(HunkOutcome(HunkStatus.FAILS, mismatch=mismatch))
    result.extend(lines[cursor:])
    return result, outcomes


def _index(start: int, expected: Sequence[str]) -> int:
    # A hunk's start is 1-based; a hunk with no expected lines inserts *after* line ``start``.
    return start - 1 if expected else start


def _find(lines: Sequence[str], expected: Sequence[str], *, center: int, low: int) -> int | None:
    """The index nearest to ``center`` (not before ``low``) where ``expected`` matches exactly, or ``None``."""
    size = len(expected)
    high = len(lines) - size
    if high < low:
        return None
    if not expected:  # nothing to match: only the stated place will do
        return center if low <= center <= len(lines) else None
    center = min(max(center, low), high)
    for distance in range(max(center - low, high - center) + 1):
        for index in (center + distance, center - distance) if distance else (center,):
            if low <= index <= high and lines[index] == expected[0] and _matches(lines, expected, index):
                return index
    return None


def _matches(lines: Sequence[str], expected: Sequence[str], index: int) -> bool:
    return all(lines[index + offset] == line for offset, line in enumerate(expected))


def _first_mismatch(lines: Sequence[str], expected: Sequence[str], *, at: int) -> Mismatch | None:
    for offset, line in enumerate(expected):
        index = at + offset
        found = lines[index] if index < len(lines) else None
        if found != line:
            return Mismatch(line=index + 1, expected=line, found=found)
    return None
