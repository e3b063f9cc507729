"""The hunk-by-hunk verdict on a series against a target, and its plain-text form.

Example:
    >>> HunkReport("0001-a.patch", "lightning/x.py", "@@ -3,6 +3,7 @@", "OK", offset=-1).describe()
    'OK (offset -1 line)'

"""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lightning_ext.patches._series import PatchError

__all__ = ["HunkReport", "HunkStatus", "PatchReport", "SeriesNotApplicableError", "SeriesReport", "SeriesState"]

HunkStatus = Literal["OK", "ALREADY APPLIED", "FAILS"]
# clean: nothing applied and every hunk applies; applied: every patch is in; partial: some patches are in and the
# others apply on top of them; conflict: anything else
SeriesState = Literal["clean", "applied", "partial", "conflict"]


@dataclass(frozen=True)
class HunkReport:
    """One hunk's verdict: ``offset`` is how far from its stated line it applies; ``detail`` says why it fails."""

    patch: str
    file: str
    header: str
    status: HunkStatus
    offset: int = 0
    detail: str = ""

    def describe(self) -> str:
        """``OK``, ``OK (offset +N lines)``, ``ALREADY APPLIED`` or ``FAILS``."""
        if self.status == "OK" and self.offset:
            return f"OK (offset {self.offset:+d} line{'' if abs(self.offset) == 1 else 's'})"
        return self.status


@dataclass(frozen=True)
class PatchReport:
    """One patch: its file name, commit subject, whether it is wholly in the target, and its hunks' verdicts."""

    name: str
    subject: str
    applied: bool
    hunks: tuple[HunkReport, ...]


@dataclass(frozen=True)
class SeriesReport:
    """Every hunk of a series, judged in order against a target (each patch on top of the previous ones)."""

    target: Path
    series: Path
    version: str | None
    state: SeriesState
    patches: tuple[PatchReport, ...]

    @property
    def ok(self) -> bool:
        """Whether the series applies cleanly or is already applied (``check`` exits 0)."""
        return self.state in ("clean", "applied")

    @property
    def applied_patches(self) -> tuple[str, ...]:
        """The patches wholly in the target."""
        return tuple(patch.name for patch in self.patches if patch.applied)

    @property
    def pending_patches(self) -> tuple[str, ...]:
        """The other patches."""
        return tuple(patch.name for patch in self.patches if not patch.applied)

    @property
    def hunks(self) -> tuple[HunkReport, ...]:
        """Every hunk of the series, in order."""
        return tuple(hunk for patch in self.patches for hunk in patch.hunks)

    def summary(self) -> str:
        """One line that says where the target stands."""
        applied, counts = ", ".join(self.applied_patches), f"({len(self.patches)} patches, {len(self.hunks)} hunks)"
        if self.state == "partial":
            return (
                f"the series is partially applied: applied: {applied}; not applied: {', '.join(self.pending_patches)}"
            )
        if self.state != "conflict":
            return f"the series {'applies cleanly' if self.state == 'clean' else 'is already applied'} {counts}"
        problems = []
        for patch in (patch for patch in self.patches if not patch.applied):
            fail, done = (sum(hunk.status == status for hunk in patch.hunks) for status in ("FAILS", "ALREADY APPLIED"))
            labelled = ((fail, "fail"), (done, "already applied"))
            parts = [f"{count} of {len(patch.hunks)} hunks {label}" for count, label in labelled if count]
            problems += [f"{patch.name}: {', '.join(parts)}"] if parts else []
        return f"the series does not apply: {'; '.join(problems)}" + (f"; applied: {applied}" if applied else "")

    def format(self) -> str:
        """The report as text: the target and series, one heading per patch, one line per hunk, then the summary."""
        lines = [f"target: {self.target} (Lightning {self.version or 'version unknown'})", f"series: {self.series}"]
        for patch in self.patches:
            lines.append(f"{patch.name}: {patch.subject}" if patch.subject else patch.name)
            for hunk in patch.hunks:
                lines.append(f"  {hunk.file} {hunk.header}: {hunk.describe()}")
                lines.extend([f"    {hunk.detail}"] if hunk.detail else [])
        return "\n".join([*lines, f"result: {self.summary()}"])


class SeriesNotApplicableError(PatchError):
    """The target is not in a state the action accepts (conflict, or partially applied); nothing was written."""

    def __init__(self, message: str, report: SeriesReport) -> None:
        super().__init__(message)
        self.report = report
