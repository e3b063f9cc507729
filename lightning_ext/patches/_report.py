"""The structured result of checking a series against a target, and its plain-text form.

Example:
    >>> hunk = HunkReport(patch="0001-a.patch", file="lightning/x.py", header="@@ -3,6 +3,7 @@", status=HunkStatus.OK,
    ...                   offset=2)
    >>> hunk.describe()
    'OK (offset +2 lines)'
    >>> Mismatch(line=7, expected="a = 1\\n", found=None).describe()
    "line 7: expected 'a = 1', found the end of the file"

"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HunkReport", "HunkStatus", "Mismatch", "PatchReport", "SeriesReport", "SeriesState"]


class HunkStatus(enum.Enum):
    """What one hunk would do to the target."""

    OK = "OK"
    ALREADY_APPLIED = "ALREADY APPLIED"
    FAILS = "FAILS"


class SeriesState(enum.Enum):
    """Where the target stands with respect to the whole series."""

    CLEAN = "clean"  # no patch applied, and every hunk applies
    APPLIED = "applied"  # every patch applied (every hunk reverse-applies, last patch first)
    PARTIAL = "partial"  # some patches applied, and the others apply on top of them
    CONFLICT = "conflict"  # anything else: some hunk fails, or a patch is only partly there


def _shown(line: str) -> str:
    return repr(line[:-1] if line.endswith("\n") else line)


@dataclass(frozen=True)
class Mismatch:
    """The first line of a failing hunk's context or removed lines that differs from the target file.

    Attributes:
        line: 1-based line number in the file (as it stands after the series' earlier patches).
        expected: the line the hunk expects, with its line ending.
        found: the line in the file, or ``None`` past the end of the file.

    """

    line: int
    expected: str
    found: str | None

    def describe(self) -> str:
        """One line: where, what was expected, what was found."""
        found = "the end of the file" if self.found is None else _shown(self.found)
        return f"line {self.line}: expected {_shown(self.expected)}, found {found}"


@dataclass(frozen=True)
class HunkReport:
    """The verdict on one hunk.

    Attributes:
        patch: the patch file name.
        file: the file as the patch names it (``lightning/pytorch/...``).
        header: the hunk header, ``@@ -a,b +c,d @@``.
        status: what the hunk would do.
        offset: for ``OK``, how many lines from its stated position the hunk was found.
        mismatch: for ``FAILS``, the first line that does not match (``None`` if the hunk matches only where it
            would overlap an earlier hunk).

    """

    patch: str
    file: str
    header: str
    status: HunkStatus
    offset: int = 0
    mismatch: Mismatch | None = None

    def describe(self) -> str:
        """``OK``, ``OK (offset +N lines)``, ``ALREADY APPLIED`` or ``FAILS``."""
        if self.status is HunkStatus.OK and self.offset:
            unit = "line" if abs(self.offset) == 1 else "lines"
            return f"OK (offset {self.offset:+d} {unit})"
        return self.status.value


@dataclass(frozen=True)
class PatchReport:
    """The verdicts on one patch's hunks.

    Attributes:
        name: the patch file name.
        subject: the commit subject from the patch header (without ``[PATCH n/m]``).
        applied: whether the whole patch is already in the target.
        hunks: one report per hunk, in patch order.

    """

    name: str
    subject: str
    applied: bool
    hunks: tuple[HunkReport, ...]


@dataclass(frozen=True)
class SeriesReport:
    """Every hunk of a series, simulated in order against a target.

    Attributes:
        target: the ``lightning`` package directory.
        series: the series directory.
        version: the target's Lightning version, if it records one.
        state: where the target stands.
        patches: one report per patch, in series order.

    """

    target: Path
    series: Path
    version: str | None
    state: SeriesState
    patches: tuple[PatchReport, ...]

    @property
    def ok(self) -> bool:
        """Whether the series applies cleanly or is already fully applied (``check`` exits 0)."""
        return self.state in (SeriesState.CLEAN, SeriesState.APPLIED)

    @property
    def applied_patches(self) -> tuple[str, ...]:
        """The names of the patches already in the target."""
        return tuple(patch.name for patch in self.patches if patch.applied)

    @property
    def pending_patches(self) -> tuple[str, ...]:
        """The names of the patches not (fully) in the target."""
        return tuple(patch.name for patch in self.patches if not patch.applied)

    @property
    def hunks(self) -> tuple[HunkReport, ...]:
        """Every hunk of the series, in order."""
        return tuple(hunk for patch in self.patches for hunk in patch.hunks)

    @property
    def nothing_applied(self) -> bool:
        """Whether no patch and no single hunk of the series is in the target."""
        return not any(hunk.status is HunkStatus.ALREADY_APPLIED for hunk in self.hunks)

    def summary(self) -> str:
        """One line that says where the target stands."""
        total = len(self.hunks)
        if self.state is SeriesState.CLEAN:
            return f"the series applies cleanly ({len(self.patches)} patches, {total} hunks)"
        if self.state is SeriesState.APPLIED:
            return f"the series is already applied ({len(self.patches)} patches, {total} hunks)"
        if self.state is SeriesState.PARTIAL:
            return (
                f"the series is partially applied: applied: {', '.join(self.applied_patches)}; "
                f"not applied: {', '.join(self.pending_patches)}"
            )
        problems = [_problems(patch) for patch in self.patches if not patch.applied]
        text = f"the series does not apply: {'; '.join(problem for problem in problems if problem)}"
        return f"{text}; applied: {', '.join(self.applied_patches)}" if self.applied_patches else text

    def format(self) -> str:
        """The full report as plain text: one heading per patch, one line per hunk, then the summary."""
        version = f"Lightning {self.version}" if self.version else "Lightning (version unknown)"
        lines = [f"target: {self.target} ({version})", f"series: {self.series} ({len(self.patches)} patches)"]
        for patch in self.patches:
            lines.append(f"{patch.name}: {patch.subject}" if patch.subject else patch.name)
            for hunk in patch.hunks:
                lines.append(f"  {hunk.file} {hunk.header}: {hunk.describe()}")
                if hunk.status is HunkStatus.FAILS:
                    detail = hunk.mismatch.describe() if hunk.mismatch else "matches only overlapping an earlier hunk"
                    lines.append(f"    {detail}")
        lines.append(f"result: {self.summary()}")
        return "\n".join(lines)


def _problems(patch: PatchReport) -> str:
    counts = {status: sum(hunk.status is status for hunk in patch.hunks) for status in HunkStatus}
    parts = [
        f"{counts[status]} of {len(patch.hunks)} hunks {label}"
        for status, label in ((HunkStatus.FAILS, "fail"), (HunkStatus.ALREADY_APPLIED, "already applied"))
        if counts[status]
    ]
    return f"{patch.name}: {', '.join(parts)}" if parts else ""
