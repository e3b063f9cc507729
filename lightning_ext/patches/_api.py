"""``check``, ``apply`` and ``revert``: ``git apply`` works the series out on a scratch copy; the target comes last.

The files the series edits are copied to a fresh temporary directory, where git runs with no configuration and no
repository around it (so that nothing on the machine changes how it matches hunks). There:

1. Last patch first, ``git apply -R`` takes out each patch that is wholly in (git checks every hunk of a patch
   before it writes any). What is left is the original tree: what ``revert`` writes.
2. First patch first, each patch taken out is put back, and each hunk of the others is tried on its own:
   ``git apply -v`` (``OK``, at git's offset), else ``git apply -R --check`` (``ALREADY APPLIED``), else ``FAILS``,
   with the first line that differs from what the hunk expects. The result is what ``apply`` writes.

Each changed target file is replaced through a temporary file and ``os.replace``, keeping its mode; if a write
fails, the files already written get their bytes back.

"""

import contextlib
import os
import re
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from lightning_ext.patches import _series
from lightning_ext.patches._report import HunkReport, HunkStatus, PatchReport, SeriesNotApplicableError, SeriesReport
from lightning_ext.patches._report import SeriesState as State
from lightning_ext.patches._series import Hunk, PatchError

__all__ = ["PatchOutcome", "apply", "check", "revert"]

_OFFSET = re.compile(r"\(offset (-?\d+) lines?\)")
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
    """Judge every hunk against the target, each patch on top of the previous ones; write nothing.

    Args:
        target: the ``lightning`` package directory; the installed one by default.
        series: the series directory; ``lightning-<target's version>`` under ``patches_root()`` by default.

    Raises:
        PatchError: no target, series or git; a malformed or unsupported patch; a path that escapes the target.

    """
    return _plan(target, series)[0]


def apply(*, target: Path | str | None = None, series: Path | str | None = None) -> PatchOutcome:
    """Apply the whole series, or nothing if a hunk fails or the tree is partially patched; idempotent.

    Raises:
        SeriesNotApplicableError: the series does not apply cleanly; nothing was written.
        PatchError: as :func:`check`, or a write failed (the files already written were restored).

    """
    report, current, _, patched = _plan(target, series)
    if report.state is State.APPLIED:
        return PatchOutcome("already applied", (), report)
    if report.state is not State.CLEAN:
        raise _refusal("apply", report)
    return PatchOutcome("applied", _write(patched, current), report)


def revert(*, target: Path | str | None = None, series: Path | str | None = None) -> PatchOutcome:
    """Take the applied patches out of a wholly or partially patched tree, restoring the original bytes.

    Raises:
        SeriesNotApplicableError: parts of the series are in, but not as whole patches; nothing was written.
        PatchError: as :func:`check`, or a write failed (the files already written were restored).

    """
    report, current, original, _ = _plan(target, series)
    if report.state in (State.APPLIED, State.PARTIAL):
        return PatchOutcome("reverted", _write(original, current), report)
    if all(hunk.status is not HunkStatus.ALREADY_APPLIED for hunk in report.hunks):
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
        for patch in patches[::-1]:
            if _git(scratch, patch.diff, "-R")[0]:
                applied.add(patch.name)
        original = {real: (Path(scratch) / path).read_bytes() for path, real in files.items()}
        reports = []
        for patch in patches:
            if patch.name in applied:  # put back what step 1 took out, for the later patches
                _git(scratch, patch.diff)
            verdicts = (_judge(scratch, patch.name, hunk, done=patch.name in applied) for hunk in patch.hunks)
            reports.append(PatchReport(patch.name, patch.subject, patch.name in applied, tuple(verdicts)))
        patched = {real: (Path(scratch) / path).read_bytes() for path, real in files.items()}
    pending = [hunk.status for report in reports if not report.applied for hunk in report.hunks]
    if not pending:
        state = State.APPLIED
    elif any(status is not HunkStatus.OK for status in pending):
        state = State.CONFLICT
    else:
        state = State.PARTIAL if applied else State.CLEAN
    version = _series.target_version(directory)
    return SeriesReport(directory, series_dir, version, state, tuple(reports)), current, original, patched


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
    command = ["git", "apply", "--whitespace=nowarn", *options]
    try:
        done = subprocess.run(
            command, input=diff.encode(_series.ENCODING, _series.ERRORS), cwd=scratch, env=env, capture_output=True
        )
    except FileNotFoundError as exc:
        raise PatchError("no 'git' on PATH: the patch tool runs 'git apply' (install git, then try again)") from exc
    return done.returncode == 0, done.stderr.decode(errors="replace")


def _judge(scratch: str, patch: str, hunk: Hunk, *, done: bool) -> HunkReport:
    verdict = HunkReport(patch, hunk.file, hunk.header, HunkStatus.ALREADY_APPLIED)
    if done:
        return verdict
    applied, said = _git(scratch, hunk.diff, "-v")
    if applied:
        offset = int(found.group(1)) if (found := _OFFSET.search(said)) else 0
        return HunkReport(patch, hunk.file, hunk.header, HunkStatus.OK, offset=offset)
    if _git(scratch, hunk.diff, "-R", "--check")[0]:
        return verdict
    text = (Path(scratch) / hunk.file).read_bytes().decode(_series.ENCODING, _series.ERRORS)
    lines = [line.removesuffix("\n") for line in re.findall(r"[^\n]*\n|[^\n]+\Z", text)]
    detail = said.strip().splitlines()[-1]  # git's own words, unless a line differs where the hunk was written for
    for number, expected in enumerate((line.removesuffix("\n") for line in hunk.expected), start=hunk.start):
        if (found := lines[number - 1] if number <= len(lines) else None) != expected:
            detail = (
                f"line {number}: expected {expected!r}, found {'the end of the file' if found is None else repr(found)}"
            )
            break
    return HunkReport(patch, hunk.file, hunk.header, HunkStatus.FAILS, detail=detail)


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
    advice = " (revert takes the applied ones out)" if report.state is State.PARTIAL else ""
    return SeriesNotApplicableError(
        f"refusing to {action}: {report.summary()}{advice}; nothing was written", report=report
    )
