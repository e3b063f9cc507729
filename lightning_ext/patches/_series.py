"""Read a patch series: ``NNNN-*.patch`` files in ``git format-patch`` form, parsed with ``unidiff``.

A format-patch file is an e-mail: headers (``Subject: [PATCH 1/2] ...``), the commit message, a ``---`` line, a
diffstat, then the ``diff --git`` sections. The e-mail part is cut off before the diff is handed to ``unidiff``, so
that nothing in a commit message can be mistaken for a diff. Files are decoded as UTF-8 with ``surrogateescape``,
and lines keep their own endings (``\\r\\n`` stays), so that applying and reverting are byte-exact.

Only changes to existing text files are supported: creating, deleting or renaming a file, mode changes and binary
changes are refused with a clear error.

"""

import email.parser
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from unidiff.errors import UnidiffParseError
from unidiff.patch import Hunk, PatchedFile, PatchSet

from lightning_ext.patches._errors import PatchError
from lightning_ext.patches._paths import package_path

__all__ = [
    "ENCODING",
    "ERRORS",
    "FileChange",
    "HunkSpec",
    "Patch",
    "Series",
    "load_series",
    "parse_patch",
    "split_lines",
]

ENCODING = "utf-8"
ERRORS = "surrogateescape"  # undecodable bytes survive a decode/encode round trip unchanged

_DEV_NULL = "/dev/null"
_SUBJECT_TAG = re.compile(r"^\[[^\]]*\]\s*")
_NO_NEWLINE = "\\"


@dataclass(frozen=True)
class HunkSpec:
    """One hunk, as the lines it expects (``old``) and the lines it leaves (``new``), with their line endings.

    Attributes:
        header: ``@@ -a,b +c,d @@`` as git writes it.
        source_start: ``a``: the first old line (1-based; 0 for an insertion into an empty file).
        target_start: ``c``: the first new line.
        old: context and removed lines, in order.
        new: context and added lines, in order.

    """

    header: str
    source_start: int
    target_start: int
    old: tuple[str, ...]
    new: tuple[str, ...]


@dataclass(frozen=True)
class FileChange:
    """The hunks a patch makes to one file.

    Attributes:
        path: the file, relative to the ``lightning`` package directory.
        hunks: in patch order.

    """

    path: PurePosixPath
    hunks: tuple[HunkSpec, ...]

    @property
    def shown(self) -> str:
        """The file as the patch names it, ``lightning/...``."""
        return f"lightning/{self.path}"


@dataclass(frozen=True)
class Patch:
    """One patch file.

    Attributes:
        name: the file name (``0001-....patch``).
        subject: the commit subject, without the ``[PATCH n/m]`` tag ('' if the file has no e-mail header).
        changes: one entry per ``diff --git`` section, in order.

    """

    name: str
    subject: str
    changes: tuple[FileChange, ...]


@dataclass(frozen=True)
class Series:
    """A patch series, in application order.

    Attributes:
        directory: where the patch files are.
        patches: sorted by file name.

    """

    directory: Path
    patches: tuple[Patch, ...]


def load_series(directory: Path) -> Series:
    """Read and parse every ``*.patch`` file in ``directory``, in file-name order.

    Raises:
        PatchError: the directory does not exist, holds no patch, or a patch is malformed or unsupported.

    """
    if not directory.is_dir():
        raise PatchError(f"the series directory {directory} does not exist")
    files = sorted(path for path in directory.glob("*.patch") if path.is_file())
    if not files:
        raise PatchError(f"the series directory {directory} holds no patches (*.patch)")
    patches = []
    for path in files:
        try:
            text = path.read_bytes().decode(ENCODING, ERRORS)
        except OSError as exc:
            raise PatchError(f"cannot read {path}: {exc}") from exc
        patches.append(parse_patch(text, name=path.name))
    return Series(directory=directory, patches=tuple(patches))


def parse_patch(text: str, *, name: str) -> Patch:
    """Parse one ``git format-patch`` file (or a bare ``git diff``).

    Args:
        text: the decoded file.
        name: the patch file name, for the result and for error messages.

    Raises:
        PatchError: no diff in it, ``unidiff`` cannot parse it, or it makes a change other than editing a file.

    """
    preamble, diff = _split_preamble(text, name=name)
    try:
        patch_set = PatchSet(diff)
    except UnidiffParseError as exc:
        raise PatchError(f"{name}: not a valid unified diff: {exc}") from exc
    changes = tuple(_file_change(patched, patch=name) for patched in patch_set)
    return Patch(name=name, subject=_subject(preamble), changes=changes)


def split_lines(text: str) -> list[str]:
    """Split on ``\\n`` only, keeping each line's ending (``\\r\\n`` stays whole; a last line may have none).

    Example:
        >>> split_lines("a\\r\\nb\\x0cc\\nlast")
        ['a\\r\\n', 'b\\x0cc\\n', 'last']

    """
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    return [*lines, parts[-1]] if parts[-1] else lines


def _split_preamble(text: str, *, name: str) -> tuple[str, str]:
    # As ``git am`` does: the message ends at the first "---" line or "diff -" line; the diff starts at the first
    # "diff --git" line from there.
    lines = split_lines(text)
    start = next((index for index, line in enumerate(lines) if _ends_message(line)), len(lines))
    for index in range(start, len(lines)):
        if lines[index].startswith("diff --git "):
            return "".join(lines[:index]), "".join(lines[index:])
    raise PatchError(f"{name}: no 'diff --git' section found (expected git format-patch output)")


def _ends_message(line: str) -> bool:
    return line.rstrip() == "---" or line.startswith("diff -")


def _subject(preamble: str) -> str:
    if not preamble.strip():
        return ""
    subject = email.parser.Parser().parsestr(preamble, headersonly=True).get("Subject", "")
    return _SUBJECT_TAG.sub("", " ".join(str(subject).split()))


def _file_change(patched: PatchedFile, *, patch: str) -> FileChange:
    shown = patched.source_file if patched.source_file != _DEV_NULL else patched.target_file
    unsupported = f"{patch}: {shown}"
    if patched.source_file == _DEV_NULL:
        raise PatchError(f"{unsupported}: creating a file is not supported")
    if patched.target_file == _DEV_NULL:
        raise PatchError(f"{unsupported}: deleting a file is not supported")
    if patched.is_binary_file:
        raise PatchError(f"{unsupported}: binary changes are not supported")
    source, target = package_path(patched.source_file, patch=patch), package_path(patched.target_file, patch=patch)
    if source != target:
        raise PatchError(f"{unsupported}: renaming a file is not supported")
    if patched.source_mode is not None and patched.target_mode not in (None, patched.source_mode):
        raise PatchError(f"{unsupported}: mode changes are not supported")
    if not len(patched):
        raise PatchError(f"{unsupported}: no hunks (only text edits are supported)")
    return FileChange(path=source, hunks=tuple(_hunk_spec(hunk) for hunk in patched))


def _hunk_spec(hunk: Hunk) -> HunkSpec:
    old: list[str] = []
    new: list[str] = []
    previous = ""
    for line in hunk:
        kind = line.line_type
        if kind == _NO_NEWLINE:  # "\ No newline at end of file": the line before it has no line feed
            if previous in (" ", "-"):
                old[-1] = old[-1].removesuffix("\n")
            if previous in (" ", "+"):
                new[-1] = new[-1].removesuffix("\n")
            continue
        if kind in (" ", "-"):
            old.append(line.value)
        if kind in (" ", "+"):
            new.append(line.value)
        previous = kind
    return HunkSpec(
        header=_header(hunk),
        source_start=hunk.source_start,
        target_start=hunk.target_start,
        old=tuple(old),
        new=tuple(new),
    )


def _header(hunk: Hunk) -> str:
    return f"@@ -{_range(hunk.source_start, hunk.source_length)} +{_range(hunk.target_start, hunk.target_length)} @@"


def _range(start: int, length: int) -> str:
    return str(start) if length == 1 else f"{start},{length}"
