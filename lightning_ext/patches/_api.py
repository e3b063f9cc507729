"""``check``, ``apply`` and ``revert``, and the hunk-by-hunk report they act on.

``git apply`` works on a scratch copy: ``-R`` takes out the patches wholly in (``revert`` writes what is left); they
go back in, and each other hunk is tried alone: ``-v`` (``OK``), ``-R --check`` (``ALREADY APPLIED``), else ``FAILS``.
"""

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lightning_ext.patches import _series
from lightning_ext.patches._series import ENCODING, ERRORS, Hunk, PatchError

__all__ = ["PatchOutcome", "SeriesNotApplicableError", "SeriesReport", "apply", "check", "revert"]

_Files = dict[Path, bytes]
# clean: nothing applied, every hunk applies; partial: the patches not applied apply on top of those applied
SeriesState = Literal["clean", "applied", "partial", "conflict"]


@dataclass(frozen=True)
class HunkReport:
    """One hunk's verdict: ``offset`` is how far from its stated line it applies; ``detail`` says why it fails."""

    patch: str
    file: str
    header: str
    status: Literal["OK", "ALREADY APPLIED", "FAILS"]
    offset: int = 0
    detail: str = ""

    def describe(self) -> str:
        """``OK``, ``OK (offset +N lines)``, ``ALREADY APPLIED`` or ``FAILS``.

        >>> HunkReport("0001-a.patch", "lightning/x.py", "@@ -3,6 +3,7 @@", "OK", offset=-1).describe()
        'OK (offset -1 line)'
        """
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
        applied, pending = ", ".join(self.applied_patches), ", ".join(self.pending_patches)
        if self.ok:
            verb = "applies cleanly" if self.state == "clean" else "is already applied"
            return f"the series {verb} ({len(self.patches)} patches, {len(self.hunks)} hunks)"
        if self.state == "partial":
            return f"the series is partially applied: applied: {applied}; not applied: {pending}"
        problems, labels = [], {"FAILS": "fail", "ALREADY APPLIED": "already applied"}
        for patch in (patch for patch in self.patches if not patch.applied):
            statuses = [hunk.status for hunk in patch.hunks]
            parts = [f"{statuses.count(s)} of {len(statuses)} hunks {w}" for s, w in labels.items() if s in statuses]
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


@dataclass(frozen=True)
class PatchOutcome:
    """What ``apply`` or ``revert`` did (``action``), the files it wrote, and the report it acted on."""

    action: Literal["applied", "already applied", "reverted", "not applied"]
    written: tuple[Path, ...]
    report: SeriesReport

    def message(self) -> str:
        """One line for people."""
        report, count = self.report, len(self.written)
        if self.action == "applied":
            return f"applied {', '.join(report.pending_patches)} to {report.target}: wrote {count} file(s)"
        if self.action == "reverted":
            return f"reverted {', '.join(report.applied_patches[::-1])} in {report.target}: restored {count} file(s)"
        return f"the series {report.series} is {self.action} to {report.target}; nothing written"


def check(*, target: Path | str | None = None, series: Path | str | None = None) -> SeriesReport:
    """Judge every hunk against ``target`` (the installed ``lightning`` by default); write nothing; or PatchError."""
    return _plan(target, series)[0]


def apply(*, target: Path | str | None = None, series: Path | str | None = None) -> PatchOutcome:
    """Apply the whole series, or nothing (SeriesNotApplicableError; PatchError if a write fails, after restoring)."""
    report, current, _, patched = _plan(target, series)
    if report.state == "applied":
        return PatchOutcome("already applied", (), report)
    if report.state != "clean":
        advice = " (revert takes the applied ones out)" if report.state == "partial" else ""
        raise SeriesNotApplicableError(f"refusing to apply: {report.summary()}{advice}; nothing was written", report)
    return PatchOutcome("applied", _write(patched, current), report)


def revert(*, target: Path | str | None = None, series: Path | str | None = None) -> PatchOutcome:
    """Take the patches wholly in the target out, restoring the original bytes (refused if others are partly in)."""
    report, current, original, _ = _plan(target, series)
    if report.state in ("applied", "partial"):
        return PatchOutcome("reverted", _write(original, current), report)
    if all(hunk.status != "ALREADY APPLIED" for hunk in report.hunks):
        return PatchOutcome("not applied", (), report)
    raise SeriesNotApplicableError(f"refusing to revert: {report.summary()}; nothing was written", report)


def _plan(target: Path | str | None, series: Path | str | None) -> tuple[SeriesReport, _Files, _Files, _Files]:
    directory = (_series.default_target() if target is None else Path(target)).resolve()
    if not (directory / "__init__.py").is_file():
        raise PatchError(f"the target {directory} is not a 'lightning' package directory (no __init__.py)")
    patches = _series.load_series(series_dir := _series.find_series(directory) if series is None else Path(series))
    files = {hunk.file: _inside(directory, hunk.file, patch.name) for patch in patches for hunk in patch.hunks}
    if len(set(files.values())) < len(files):
        raise PatchError(f"two files of the series are one file in {directory} (a symlink); not supported")
    current = {real: real.read_bytes() for real in files.values()}
    with tempfile.TemporaryDirectory(prefix="lightning-ext-patches-") as scratch:
        copies = {Path(scratch, file): real for file, real in files.items()}
        for copy, real in copies.items():
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(current[real])
        applied = {patch.name for patch in patches[::-1] if _git(scratch, patch.diff, "-R")[0]}  # last first
        original = {real: copy.read_bytes() for copy, real in copies.items()}
        reports = []
        for patch in patches:
            if done := patch.name in applied:  # put it back, for the later patches
                _git(scratch, patch.diff)
            verdicts = tuple(_judge(scratch, patch.name, hunk, applied=done) for hunk in patch.hunks)
            reports.append(PatchReport(patch.name, patch.subject, done, verdicts))
        patched = {real: copy.read_bytes() for copy, real in copies.items()}
    pending = {hunk.status for report in reports if not report.applied for hunk in report.hunks}
    state: SeriesState = (
        "applied" if not pending else "conflict" if pending != {"OK"} else "partial" if applied else "clean"
    )
    report = SeriesReport(directory, series_dir, _series.target_version(directory), state, tuple(reports))
    return report, current, original, patched


def _inside(target: Path, file: str, patch: str) -> Path:
    real = (target / Path(file).relative_to("lightning")).resolve()
    if not real.is_relative_to(target):
        raise PatchError(f"{patch}: refusing path {file!r}: it resolves outside the target {target} (to {real})")
    if not real.is_file():
        raise PatchError(f"{patch}: {file} is not a file in the target {target}")
    return real


def _git(scratch: str, diff: str, *options: str) -> tuple[bool, str]:
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1"}
    env |= {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CEILING_DIRECTORIES": str(Path(scratch).parent)}  # no repository
    command, data = ["git", "apply", "--whitespace=nowarn", *options], diff.encode(ENCODING, ERRORS)
    try:
        done = subprocess.run(command, input=data, cwd=scratch, env=env, capture_output=True, timeout=60)
    except FileNotFoundError as exc:
        raise PatchError("no 'git' on PATH: the patch tool runs 'git apply' (install git, then try again)") from exc
    return done.returncode == 0, done.stderr.decode(errors="replace")


def _judge(scratch: str, patch: str, hunk: Hunk, *, applied: bool) -> HunkReport:
    verdict = functools.partial(HunkReport, patch, hunk.file, hunk.header)
    ok, said = (False, "") if applied else _git(scratch, hunk.diff, "-v")
    if ok:
        offset = re.search(r"\(offset (-?\d+) lines?\)", said)
        return verdict("OK", offset=int(offset[1]) if offset else 0)
    if applied or _git(scratch, hunk.diff, "-R", "--check")[0]:
        return verdict("ALREADY APPLIED")
    lines = re.findall(r"[^\n]*\n|[^\n]+\Z", (Path(scratch) / hunk.file).read_bytes().decode(ENCODING, ERRORS))
    for number, expected in enumerate((line.removesuffix("\n") for line in hunk.expected), start=hunk.start):
        if (found := lines[number - 1].removesuffix("\n") if number <= len(lines) else None) != expected:
            found = "the end of the file" if found is None else repr(found)
            return verdict("FAILS", detail=f"line {number}: expected {expected!r}, found {found}")
    return verdict("FAILS", detail=(said.strip().splitlines() or ["git apply failed"])[-1])  # git's words


def _write(contents: _Files, current: _Files) -> tuple[Path, ...]:
    written: list[Path] = []
    try:
        for path in [path for path, data in contents.items() if data != current[path]]:
            if path.read_bytes() != current[path]:
                raise PatchError(f"{path} changed on disk while the series was being worked out")
            _replace(path, contents[path])
            written.append(path)
    except (OSError, PatchError) as exc:
        for path in written:  # an error here propagates, naming the file that could not be restored
            _replace(path, current[path])
        raise PatchError(f"writing failed ({exc}); restored the {len(written)} file(s) already written") from exc
    return tuple(written)


def _replace(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".lightning-ext-tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            os.fsync(stream.fileno())
        shutil.copymode(path, temporary)
        os.replace(temporary, path)
    finally:  # a no-op once replaced
        Path(temporary).unlink(missing_ok=True)
