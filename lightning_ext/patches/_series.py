"""Find the target ``lightning`` package and its series; split each ``git format-patch`` file into hunks for git.

Only edits of existing text files under ``lightning/`` are accepted; every path is checked before any file is read.

Example:
    >>> _package_file("b/lightning/../../etc/x", "0001-x.patch")
    Traceback (most recent call last):
    ...
    lightning_ext.patches._series.PatchError: 0001-x.patch: refusing path 'b/lightning/../../etc/x': it contains '..'

"""

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

__all__ = ["Hunk", "Patch", "PatchError", "default_target", "find_series", "load_series", "patches_root"]

ENCODING, ERRORS = "utf-8", "surrogateescape"  # undecodable bytes survive a decode/encode round trip


class PatchError(Exception):
    """A series that cannot be checked, applied or reverted as asked; the message (one line) says why."""


@dataclass(frozen=True)
class Hunk:
    """A hunk: its file and header as written, a single-hunk ``diff`` for git, and the lines it ``expected``."""

    file: str
    header: str
    diff: str
    start: int  # where ``expected`` starts, once the file's earlier hunks are in
    expected: tuple[str, ...]


@dataclass(frozen=True)
class Patch:
    """One patch file: its name, commit subject, the diff part for ``git apply``, and its hunks."""

    name: str
    subject: str
    diff: str
    hunks: tuple[Hunk, ...]


def patches_root() -> Path:
    """Where the series live: ``lightning_ext/_series`` in a wheel (see pyproject.toml), else ``<checkout>/patches``."""
    package = Path(__file__).resolve().parents[1]
    return package / "_series" if (package / "_series").is_dir() else package.parent / "patches"


def default_target() -> Path:
    """The installed ``lightning`` package directory, found without importing it."""
    spec = importlib.util.find_spec("lightning")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("the 'lightning' package is not installed here; pass --target DIR")
    return Path(next(iter(spec.submodule_search_locations)))


def target_version(target: Path) -> str | None:
    """The first line of ``version.info`` beside or inside the package (where Lightning reads it), if any."""
    for path in (target.parent / "version.info", target / "version.info"):
        if path.is_file():
            return (path.read_text(encoding="utf-8").splitlines() or [""])[0].strip() or None
    return None


def find_series(target: Path, *, root: Path | None = None) -> Path:
    """``<root>/lightning-<target's version>``; the error lists the versions that have a series."""
    root = patches_root() if root is None else root
    if (version := target_version(target)) is None:
        raise PatchError(f"cannot tell the Lightning version of {target} (no version.info); pass --series DIR")
    if not (series := root / f"lightning-{version}").is_dir():
        available = ", ".join(sorted(path.name for path in root.glob("lightning-*") if path.is_dir())) or "none"
        raise PatchError(f"no patch series for Lightning {version}: {series} does not exist (available: {available})")
    return series


def load_series(directory: Path) -> tuple[Patch, ...]:
    """Read and split every ``*.patch`` file of ``directory``, in file-name order."""
    if not directory.is_dir():
        raise PatchError(f"the series directory {directory} does not exist")
    if not (files := sorted(directory.glob("*.patch"))):
        raise PatchError(f"the series directory {directory} holds no patches (*.patch)")
    return tuple(_parse(path.read_bytes().decode(ENCODING, ERRORS), name=path.name) for path in files)


def _package_file(raw: str, patch: str) -> str:
    rest = raw[2:] if raw[:2] in ("a/", "b/") else raw
    if raw.startswith('"') or "\\" in raw:
        reason = "quoted or escaped file names are not supported"
    elif rest.startswith("/"):
        reason = "it is absolute"
    elif ".." in (parts := PurePosixPath(rest).parts):
        reason = "it contains '..'"
    elif raw[:2] not in ("a/", "b/") or len(parts) < 2 or parts[0] != "lightning":
        reason = "it is not a file inside 'lightning/'"
    else:
        return "/".join(parts)
    raise PatchError(f"{patch}: refusing path {raw!r}: {reason}")


def _parse(text: str, *, name: str) -> Patch:
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
        unsupported = {
            "creating a file": patched.is_added_file,
            "deleting a file": patched.is_removed_file,
            "renaming a file": patched.is_rename,
            "changing a file's mode": patched.source_mode != patched.target_mode,
            "a binary change": patched.is_binary_file or not patched,
        }
        if kind := next((kind for kind, found in unsupported.items() if found), None):
            raise PatchError(f"{name}: {patched.path}: {kind} is not supported (only edits of text files are)")
        file, _ = _package_file(patched.source_file, name), _package_file(patched.target_file, name)
        shift = 0  # the lines that the file's earlier hunks add
        for hunk in patched:
            old, new = f"{hunk.source_start + shift},{hunk.source_length}", f"{hunk.target_start},{hunk.target_length}"
            single = f"--- a/{file}\n+++ b/{file}\n@@ -{old} +{new} @@\n{''.join(map(str, hunk))}"
            expected = tuple(line.value for line in hunk if line.line_type in (" ", "-"))
            hunks.append(Hunk(file, next(headers), single, hunk.source_start + shift, expected))
            shift += hunk.target_length - hunk.source_length
    subject = re.search(r"^Subject: (?:\[[^]]*\] *)?(.*(?:\n[ \t].*)*)", text[: start.start()], re.MULTILINE)
    return Patch(name, " ".join(subject[1].split()) if subject else "", diff, tuple(hunks))
