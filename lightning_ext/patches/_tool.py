"""Find the patch series for a ``lightning`` or ``pytorch_lightning`` package, judge it hunk by hunk with ``git apply``,
apply or revert it."""

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Literal, NamedTuple

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from lightning_ext._packages.choice import RENAMES, Package
from lightning_ext.errors import PatchError, SeriesNotApplicableError

__all__ = ["Hunk", "Patch", "SeriesReport", "apply", "check", "installed_targets", "revert"]

_ENCODING = {"encoding": "utf-8", "errors": "surrogateescape"}  # undecodable bytes survive a round trip
_Files = dict[Path, bytes]
_State = Literal["clean", "partial", "applied", "conflict"]
_WORDS = (("FAILS", "fail"), ("ALREADY APPLIED", "already applied"))  # how the summary counts a patch's hunks


class Hunk(NamedTuple):
    """A hunk as written, as a single-hunk diff for git, and what it expects from line ``start`` on; once judged, its
    ``status`` and ``detail``: where git applies an ``OK`` hunk off its stated line, or why one ``FAILS``."""

    patch: str
    file: str
    header: str
    diff: str
    start: int
    expected: tuple[str, ...]
    status: Literal["OK", "ALREADY APPLIED", "FAILS", "unjudged"] = "unjudged"
    detail: str = ""


class Patch(NamedTuple):
    """One patch file: its name, the diff part for ``git apply``, its hunks, and whether it is wholly in the target."""

    name: str
    diff: str
    hunks: tuple[Hunk, ...]
    applied: bool = False


@dataclass(frozen=True)
class SeriesReport:
    """A series judged hunk by hunk against a target (each patch on top of the previous ones), and what was written.

    ``state``: ``clean`` (nothing in, every hunk applies), ``partial`` (some patches in, the others apply on top),
    ``applied``, or ``conflict``. ``written``: the files that ``apply`` or ``revert`` replaced.
    """

    target: Path
    series: Path
    version: str | None
    state: _State
    patches: tuple[Patch, ...]
    written: tuple[Path, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether ``apply`` can bring the whole series in (``check`` exits 0)."""
        return self.state != "conflict"

    @property
    def revertible(self) -> bool:
        """Whether ``revert`` can take out what is in: no patch is partly in the target."""
        pending = (hunk for patch in self.patches if not patch.applied for hunk in patch.hunks)
        return not any(hunk.status == "ALREADY APPLIED" for hunk in pending)

    @property
    def hunks(self) -> tuple[Hunk, ...]:
        """Every hunk of the series, in order."""
        return tuple(hunk for patch in self.patches for hunk in patch.hunks)

    def summary(self) -> str:
        """One line that says where the target stands."""
        applied = ", ".join(patch.name for patch in self.patches if patch.applied)
        if self.state in ("clean", "applied"):
            verb = "applies cleanly" if self.state == "clean" else "is already applied"
            return f"the series {verb} ({len(self.patches)} patches, {len(self.hunks)} hunks)"
        if self.state == "partial":
            pending = ", ".join(patch.name for patch in self.patches if not patch.applied)
            return f"the series is partially applied: applied: {applied}; not applied, and applies cleanly: {pending}"
        problems = []
        for patch in (patch for patch in self.patches if not patch.applied):
            counts = [(sum(hunk.status == status for hunk in patch.hunks), word) for status, word in _WORDS]
            if parts := ", ".join(f"{n} of {len(patch.hunks)} hunks {word}" for n, word in counts if n):
                problems.append(f"{patch.name}: {parts}")
        return f"the series does not apply: {'; '.join(problems)}" + (f"; applied: {applied}" if applied else "")

    def format(self) -> str:
        """The report as text: the target and series, one heading per patch, one line per hunk, then the summary."""
        lines = [f"target: {self.target} (Lightning {self.version or 'version unknown'})", f"series: {self.series}"]
        for patch in self.patches:
            lines.append(patch.name)
            for hunk in patch.hunks:
                lines.append(f"  {hunk.file} {hunk.header}: {hunk.status}")
                if hunk.detail:
                    lines[-1] += f" ({hunk.detail})" if hunk.status == "OK" else f"\n    {hunk.detail}"
        return "\n".join([*lines, f"result: {self.summary()}"])


def check(*, target: Path | str | None = None, series: Path | str | None = None) -> SeriesReport:
    """Judge every hunk against ``target`` (by default the first of :func:`installed_targets`); write nothing."""
    return _plan(target, series)[0]


def apply(*, target: Path | str | None = None, series: Path | str | None = None) -> SeriesReport:
    """Bring the whole series in, or write nothing (SeriesNotApplicableError; a failed write is undone)."""
    report, current, _, patched = _plan(target, series)
    if not report.ok:
        raise SeriesNotApplicableError("apply", report)
    return replace(report, written=_write(patched, current))


def revert(*, target: Path | str | None = None, series: Path | str | None = None) -> SeriesReport:
    """Take the patches wholly in the target out, restoring the original bytes (refused if another is partly in)."""
    report, current, original, _ = _plan(target, series)
    if not report.revertible:
        raise SeriesNotApplicableError("revert", report)
    return replace(report, written=_write(original, current))


def installed_targets() -> tuple[Path, ...]:
    """The installed ``lightning`` and ``pytorch_lightning`` package directories, found without importing them."""
    found = []
    for name in ("lightning", "pytorch_lightning"):
        if (spec := importlib.util.find_spec(name)) is not None and spec.submodule_search_locations:
            found.append(Path(next(iter(spec.submodule_search_locations))))
    if not found:
        raise PatchError("neither 'lightning' nor 'pytorch_lightning' is installed here; pass --target DIR")
    return tuple(found)


def target_package(target: Path) -> Package:
    """Which Lightning package ``target`` is, from its layout: ``lightning`` holds ``pytorch/``."""
    if (target / "pytorch").is_dir():
        return "lightning"
    if (target / "trainer").is_dir():
        return "pytorch_lightning"
    raise PatchError(f"the target {target} is neither a 'lightning' nor a 'pytorch_lightning' package directory")


def target_version(target: Path) -> str | None:
    """The first line of ``version.info`` beside or inside the package (where Lightning reads it), if any."""
    for path in (target.parent / "version.info", target / "version.info"):
        if path.is_file():
            return path.read_text(encoding="utf-8").partition("\n")[0].strip() or None
    return None


def find_series(target: Path, *, root: Path | None = None) -> Path:
    """``<root>/lightning-<target's version>``; ``root`` is ``lightning_ext/patches/series`` in a wheel, else the
    repository's ``patches/``."""
    if root is None:  # pyproject.toml ships the repository's patches/ as lightning_ext/patches/series
        here = Path(__file__).resolve().parent
        root = here / "series" if (here / "series").is_dir() else here.parents[1] / "patches"
    if (version := target_version(target)) is None:
        raise PatchError(f"cannot tell the Lightning version of {target} (no version.info); pass --series DIR")
    if not (series := root / f"lightning-{version}").is_dir():
        available = ", ".join(sorted(path.name for path in root.glob("lightning-*") if path.is_dir())) or "none"
        raise PatchError(f"no patch series for Lightning {version}: {series} does not exist (available: {available})")
    return series


def load_series(directory: Path, package: Package = "lightning") -> tuple[Patch, ...]:
    """Read and split every ``*.patch`` file of ``directory``, in file-name order, for ``package``'s tree.

    The series is written against ``lightning/``; for ``pytorch_lightning/`` it is renamed as Lightning renames its
    sources for that package (:func:`for_pytorch_lightning`).
    """
    if not (files := sorted(directory.glob("*.patch"))):
        problem = "holds no patches (*.patch)" if directory.is_dir() else "does not exist"
        raise PatchError(f"the series directory {directory} {problem}")
    texts = ((path.name, path.read_bytes().decode(**_ENCODING)) for path in files)
    rename = for_pytorch_lightning if package == "pytorch_lightning" else str
    return tuple(_parse(rename(text), name=name, package=package) for name, text in texts)


def for_pytorch_lightning(text: str) -> str:
    """A patch against ``lightning/`` as the same patch against ``pytorch_lightning/``.

    Its file paths ``a/lightning/pytorch/...`` become ``a/pytorch_lightning/...``, and on every line
    ``lightning.pytorch`` becomes ``pytorch_lightning`` and ``lightning.fabric`` becomes ``lightning_fabric``, with
    Lightning's own rule (``.actions/assistant.py``, ``_replace_imports``). Line counts do not change.

    Example:
        >>> for_pytorch_lightning("--- a/lightning/pytorch/x.py\\n from lightning.pytorch.utilities import y\\n")
        '--- a/pytorch_lightning/x.py\\n from pytorch_lightning.utilities import y\\n'

    """
    text = re.sub(r"^((?:diff --git|---|\+\+\+) .*)$", _standalone_paths, text, flags=re.MULTILINE)
    for unified, standalone in RENAMES:
        text = re.sub(rf"([^_/@]|^){re.escape(unified)}([^_\w/]|$)", rf"\g<1>{standalone}\g<2>", text, flags=re.M)
    return text


def _standalone_paths(line: re.Match[str]) -> str:
    return re.sub(r"(?<=[ab]/)lightning/pytorch/", "pytorch_lightning/", line[1])


def _parse(text: str, *, name: str, package: Package) -> Patch:
    # As `git am` does, the commit message ends at the first "---" line; the diff starts at the next "diff --git".
    message_end = re.search(r"^---$", text, re.MULTILINE)
    if not (start := re.compile(r"^diff --git ", re.MULTILINE).search(text, message_end.end() if message_end else 0)):
        raise PatchError(f"{name}: no 'diff --git' section found (expected git format-patch output)")
    try:
        patched_files = PatchSet(diff := text[start.start() :])
    except UnidiffParseError as exc:
        raise PatchError(f"{name}: not a valid unified diff: {exc}") from exc
    hunks, headers = [], iter(re.findall(r"^@@ -\S+ \+\S+ @@", diff, re.MULTILINE))
    for patched in patched_files:
        for kind, found in [
            ("creating a file", patched.is_added_file),
            ("deleting a file", patched.is_removed_file),
            ("renaming a file", patched.is_rename),
            ("changing a file's mode", patched.source_mode != patched.target_mode),
            ("a binary change", patched.is_binary_file or not patched),
        ]:
            if found:
                raise PatchError(f"{name}: {patched.path}: {kind} is not supported (only edits of text files are)")
        file = _package_file(patched.source_file, name, package)
        _package_file(patched.target_file, name, package)
        shift = 0  # the lines that the file's earlier hunks add
        for hunk in patched:
            old, new = f"{hunk.source_start + shift},{hunk.source_length}", f"{hunk.target_start},{hunk.target_length}"
            single = f"--- a/{file}\n+++ b/{file}\n@@ -{old} +{new} @@\n{''.join(map(str, hunk))}"
            expected = tuple(line.value.removesuffix("\n") for line in hunk if line.line_type in (" ", "-"))
            hunks.append(Hunk(name, file, next(headers), single, hunk.source_start + shift, expected))
            shift += hunk.target_length - hunk.source_length
    return Patch(name, diff, tuple(hunks))


def _package_file(raw: str, patch: str, package: Package) -> str:
    """The path of a patched file inside the ``package`` directory; every path is checked before a file is read.

    Example:
        >>> _package_file("b/lightning/../../etc/x", "0001-x.patch", "lightning")
        Traceback (most recent call last):
        lightning_ext.errors.PatchError: 0001-x.patch: refusing path 'b/lightning/../../etc/x': ...

    """
    parts = PurePosixPath(raw).parts
    if raw[:2] not in ("a/", "b/") or parts[1:2] != (package,) or len(parts) < 3 or ".." in parts:
        reason = f"it is not a path inside '{package}/' without '..'"
    elif raw.startswith('"') or "\\" in raw or "//" in raw:
        reason = "quoted, escaped or doubled-slash file names are not supported"
    else:
        return "/".join(parts[1:])
    raise PatchError(f"{patch}: refusing path {raw!r}: {reason}")


def _plan(target: Path | str | None, series: Path | str | None) -> tuple[SeriesReport, _Files, _Files, _Files]:
    """The report, then the current, original (nothing applied) and patched bytes of each file the series edits."""
    directory = (installed_targets()[0] if target is None else Path(target)).resolve()
    if not (directory / "__init__.py").is_file():
        raise PatchError(f"the target {directory} is not a Lightning package directory (no __init__.py)")
    series_dir = find_series(directory) if series is None else Path(series)
    patches = load_series(series_dir, target_package(directory))
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
            reports.append(patch._replace(applied=done, hunks=tuple(_judge(scratch, h, done) for h in patch.hunks)))
        patched = {real: copy.read_bytes() for copy, real in copies.items()}
    pending = {hunk.status for report in reports if not report.applied for hunk in report.hunks}
    state: _State = "applied" if not pending else "conflict" if pending != {"OK"} else "partial" if applied else "clean"
    report = SeriesReport(directory, series_dir, target_version(directory), state, tuple(reports))
    return report, current, original, patched


def _inside(target: Path, file: str, patch: str) -> Path:
    real = (target / file.partition("/")[2]).resolve()
    if not real.is_relative_to(target):
        raise PatchError(f"{patch}: refusing path {file!r}: it resolves outside the target {target} (to {real})")
    if not real.is_file():
        raise PatchError(f"{patch}: {file} is not a file in the target {target}")
    return real


def _git(scratch: str, diff: str, *options: str) -> tuple[bool, str]:
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1"}
    env |= {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CEILING_DIRECTORIES": str(Path(scratch).parent)}  # no repository
    command, data = ["git", "apply", "--whitespace=nowarn", *options], diff.encode(**_ENCODING)
    try:
        done = subprocess.run(command, input=data, cwd=scratch, env=env, capture_output=True, timeout=60)
    except FileNotFoundError as exc:
        raise PatchError("no 'git' on PATH: the patch tool runs 'git apply' (install git, then try again)") from exc
    return done.returncode == 0, done.stderr.decode(errors="replace")


def _judge(scratch: str, hunk: Hunk, applied: bool) -> Hunk:
    if not applied and (tried := _git(scratch, hunk.diff, "-v"))[0]:
        offset = re.search(r"\((offset -?\d+ lines?)\)", tried[1])  # git's words
        return hunk._replace(status="OK", detail=offset[1] if offset else "")
    if applied or _git(scratch, hunk.diff, "-R", "--check")[0]:
        return hunk._replace(status="ALREADY APPLIED")
    lines = (Path(scratch) / hunk.file).read_bytes().decode(**_ENCODING).removesuffix("\n").split("\n")
    for number, expected in enumerate(hunk.expected, start=hunk.start):
        if (found := lines[number - 1] if number <= len(lines) else None) != expected:
            where = "the end of the file" if found is None else repr(found)
            return hunk._replace(status="FAILS", detail=f"line {number}: expected {expected!r}, found {where}")
    return hunk._replace(status="FAILS", detail=tried[1].strip().split("\n")[-1])  # git's words


def _write(contents: _Files, current: _Files) -> tuple[Path, ...]:
    """Replace each changed file through a temporary file and ``os.replace``; on an error, restore those written."""
    written: list[Path] = []
    try:
        for path in [path for path, data in contents.items() if data != current[path]]:
            if path.read_bytes() != current[path]:
                raise PatchError(f"{path} changed on disk while the series was being worked out")
            written.append(_replace(path, contents[path]))
    except (OSError, PatchError) as exc:
        for path in written:  # an error here propagates, naming the file that could not be restored
            _replace(path, current[path])
        raise PatchError(f"writing failed ({exc}); restored the {len(written)} file(s) already written") from exc
    return tuple(written)


def _replace(path: Path, data: bytes) -> Path:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".lightning-ext-tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            os.fsync(stream.fileno())
        shutil.copymode(path, temporary)
        os.replace(temporary, path)
    finally:  # a no-op once replaced
        Path(temporary).unlink(missing_ok=True)
    return path
