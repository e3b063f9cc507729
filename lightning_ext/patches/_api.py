"""``check``, ``apply`` and ``revert``: ``git apply`` works the series out on a scratch copy; the target comes last.

In a temporary copy of the files the series edits (no git configuration or repository around it), ``git apply -R``
takes out each patch that is wholly in, last first: what is left is what ``revert`` writes. Then, first patch
first, the patches taken out are put back and each hunk of the others is tried alone: ``git apply -v`` (``OK``),
else ``git apply -R --check`` (``ALREADY APPLIED``), else ``FAILS``. The result is what ``apply`` writes, each file
through a temporary file and ``os.replace`` (keeping its mode); if a write fails, the files written are restored.
"""

import contextlib
import functools
import os
import re
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from lightning_ext.patches import _series
from lightning_ext.patches._report import HunkReport, PatchReport, SeriesNotApplicableError, SeriesReport, SeriesState
from lightning_ext.patches._series import Hunk, PatchError

__all__ = ["PatchOutcome", "apply", "check", "revert"]

_Files = dict[Path, bytes]


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
    """Judge every hunk against ``target`` (the installed ``lightning`` by default) and write nothing.

    Raises:
        PatchError: no target, series or git; a malformed or unsupported patch; a path leading out of the target.
    """
    return _plan(target, series)[0]


def apply(*, target: Path | str | None = None, series: Path | str | None = None) -> PatchOutcome:
    """Apply the whole series; nothing if it is already applied.

    Raises:
        SeriesNotApplicableError: a hunk fails or the tree is partly patched; nothing was written.
        PatchError: as :func:`check`, or a write failed (the files already written were restored).
    """
    report, current, _, patched = _plan(target, series)
    if report.state == "applied":
        return PatchOutcome("already applied", (), report)
    if report.state != "clean":
        raise _refusal("apply", report)
    return PatchOutcome("applied", _write(patched, current), report)


def revert(*, target: Path | str | None = None, series: Path | str | None = None) -> PatchOutcome:
    """Take the applied patches out of a wholly or partly patched tree, restoring the original bytes.

    Raises:
        SeriesNotApplicableError: parts of the series are in, but not as whole patches; nothing was written.
        PatchError: as :func:`apply`.
    """
    report, current, original, _ = _plan(target, series)
    if report.state in ("applied", "partial"):
        return PatchOutcome("reverted", _write(original, current), report)
    if all(hunk.status != "ALREADY APPLIED" for hunk in report.hunks):
        return PatchOutcome("not applied", (), report)
    raise _refusal("revert", report)


def _plan(target: Path | str | None, series: Path | str | None) -> tuple[SeriesReport, _Files, _Files, _Files]:
    directory = _series.default_target() if target is None else Path(target)
    if not (directory / "__init__.py").is_file():
        raise PatchError(f"the target {directory} is not a 'lightning' package directory (no __init__.py)")
    directory = directory.resolve()
    series_dir = _series.find_series(directory) if series is None else Path(series)
    patches = _series.load_series(series_dir)
    files = {
        PurePosixPath(hunk.file): _inside(directory, hunk.file, patch.name) for patch in patches for hunk in patch.hunks
    }
    if len(set(files.values())) < len(files):
        raise PatchError(f"two files of the series are one file in {directory} (a symlink); not supported")
    current = {real: real.read_bytes() for real in files.values()}
    with tempfile.TemporaryDirectory(prefix="lightning-ext-patches-") as scratch:
        for path, real in files.items():
            (Path(scratch) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(scratch) / path).write_bytes(current[real])
        applied = set()
        for patch in patches[::-1]:  # take out each patch that is wholly in, last first
            if _git(scratch, patch.diff, "-R")[0]:
                applied.add(patch.name)
        original = {real: (Path(scratch) / path).read_bytes() for path, real in files.items()}
        reports = []
        for patch in patches:
            if done := patch.name in applied:  # put it back, for the later patches
                _git(scratch, patch.diff)
            verdicts = tuple(_judge(scratch, patch.name, hunk, applied=done) for hunk in patch.hunks)
            reports.append(PatchReport(patch.name, patch.subject, done, verdicts))
        patched = {real: (Path(scratch) / path).read_bytes() for path, real in files.items()}
    pending = {hunk.status for report in reports if not report.applied for hunk in report.hunks}
    state: SeriesState = (
        "applied" if not pending else "conflict" if pending != {"OK"} else "partial" if applied else "clean"
    )
    report = SeriesReport(directory, series_dir, _series.target_version(directory), state, tuple(reports))
    return report, current, original, patched


def _inside(target: Path, file: str, patch: str) -> Path:
    real = (target / PurePosixPath(file).relative_to("lightning")).resolve()
    if not real.is_relative_to(target):
        raise PatchError(f"{patch}: refusing path {file!r}: it resolves outside the target {target} (to {real})")
    if not real.is_file():
        raise PatchError(f"{patch}: {file} is not a file in the target {target}")
    return real


def _git(scratch: str, diff: str, *options: str) -> tuple[bool, str]:
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1"}
    env |= {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CEILING_DIRECTORIES": str(Path(scratch).parent)}  # no repository
    command, data = ["git", "apply", "--whitespace=nowarn", *options], diff.encode(_series.ENCODING, _series.ERRORS)
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
    text = (Path(scratch) / hunk.file).read_bytes().decode(_series.ENCODING, _series.ERRORS)
    lines = [line.removesuffix("\n") for line in re.findall(r"[^\n]*\n|[^\n]+\Z", text)]
    detail = (said.strip().splitlines() or ["git apply failed"])[-1]  # git's words, unless a line differs below
    for number, expected in enumerate((line.removesuffix("\n") for line in hunk.expected), start=hunk.start):
        if (found := lines[number - 1] if number <= len(lines) else None) != expected:
            detail = (
                f"line {number}: expected {expected!r}, found {'the end of the file' if found is None else repr(found)}"
            )
            break
    return verdict("FAILS", detail=detail)


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
        os.chmod(temporary, stat.S_IMODE(path.stat().st_mode))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _refusal(action: str, report: SeriesReport) -> SeriesNotApplicableError:
    advice = " (revert takes the applied ones out)" if report.state == "partial" else ""
    return SeriesNotApplicableError(f"refusing to {action}: {report.summary()}{advice}; nothing was written", report)
