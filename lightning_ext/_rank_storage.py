"""Where a per-rank metrics file lives: a local file written durably, or part objects on an fsspec filesystem.

:class:`LocalFile` (a plain path or a ``file://`` URL) appends each flush with one ``os.write`` on an ``O_APPEND``
descriptor and rewrites the file atomically (temporary file, ``fsync``, rename) when the header grows; see
:mod:`lightning_ext._durable`. Other filesystems (``s3://``, ``gs://``, ``memory://``, ...) may have no append, rename
or ``fsync``; there :class:`PartedFile` writes each flush as a new, complete CSV object next to the file,
``<file>.part-<token>-<n>``, and :meth:`PartedFile.close` merges them into ``<file>`` (one read of the parts, one write)
and deletes them. ``<token>`` is a digest of the file's bytes when the parts were started, so that parts already merged
into the file are never counted twice: a reader takes the file plus the parts whose token matches it.

Example:
    >>> join("s3://bucket/logs", "rank_0/metrics.csv")
    's3://bucket/logs/rank_0/metrics.csv'
    >>> split_location("file:///tmp/x.csv")[1:]
    ('/tmp/x.csv', True)

"""

import contextlib
import hashlib
import os
import posixpath
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from lightning_ext._durable import (
    append_all,
    complete_prefix_length,
    fsync_directory,
    open_for_append,
    replace_atomically,
)
from lightning_ext._metrics_csv import (
    STEP,
    Cell,
    RankMetricsWarning,
    check_header,
    decode,
    encode_rows,
    iter_records,
    split_header,
    whole_number,
)

__all__ = [
    "LocalFile",
    "PartedFile",
    "Start",
    "glob_escape",
    "join",
    "open_storage",
    "part_pattern",
    "read_chunks",
    "split_location",
    "write_whole",
]

Row = Mapping[str, Cell]
_PART = re.compile(r"\.part-([0-9a-f]{16})-([0-9]+)$")


@dataclass(frozen=True)
class Start:
    """What a storage found when it opened: the header in place, the rows kept, where an old file was moved."""

    fieldnames: list[str]
    rows: int
    rotated_to: str | None


def split_location(location: str | os.PathLike[str]) -> tuple[AbstractFileSystem, str, bool]:
    """``(filesystem, path on it, is local)``; a plain path stays as given (relative paths stay relative)."""
    text = os.fspath(location)
    if "://" not in text and "::" not in text:
        return LocalFileSystem(), text, True
    fs, path = url_to_fs(text)
    return fs, path, isinstance(fs, LocalFileSystem)


def join(base: str, relative: str) -> str:
    """``relative`` under ``base``: ``/``-joined for a URL, ``os.path.join`` for a local path."""
    if "://" in base:
        return posixpath.join(base, relative)
    return os.path.join(base, relative)


def glob_escape(text: str) -> str:
    """``text`` with the glob characters ``*?[`` made literal."""
    return re.sub(r"([*?[])", r"[\1]", text)


def part_pattern() -> re.Pattern[str]:
    """The suffix of a part object's name: ``.part-<token>-<n>``."""
    return _PART


def write_whole(location: str, data: bytes) -> None:
    """Make ``data`` the whole content of ``location``: atomically on a local disk, one object write elsewhere."""
    fs, path, local = split_location(location)
    if local:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        replace_atomically(path, data)
        fsync_directory(os.path.dirname(path) or ".")
    else:
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.pipe_file(path, data)


def open_storage(location: str | os.PathLike[str]) -> "LocalFile | PartedFile":
    """The storage for a per-rank file at ``location``."""
    fs, path, local = split_location(location)
    if local:
        return LocalFile(path)
    return PartedFile(fs, path, fs.unstrip_protocol(path))


class LocalFile:
    """A local file: appended with ``O_APPEND``, rewritten atomically when the header grows, ``fsync``-ed on close."""

    def __init__(self, path: str) -> None:
        self.where = path
        self._path = path
        self._fd: int | None = None
        self._size = 0  # bytes in the file, to undo a partial append
        self._has_header = False
        self._renamed = False  # a rename not yet made durable

    def start(self, resume_from_step: int | None) -> Start:
        """Create the directory; move an old file aside (new run) or keep its rows up to the step (resume)."""
        directory = os.path.dirname(self._path) or "."
        os.makedirs(directory, exist_ok=True)
        if not os.path.lexists(self._path):
            return Start([], 0, None)
        if resume_from_step is None:
            rotated = _free_name(self._path, os.path.lexists)
            os.rename(self._path, rotated)
            fsync_directory(directory)
            return Start([], 0, rotated)
        with open(self._path, "rb") as handle:
            data = handle.read()
        complete = complete_prefix_length(data)
        if complete < len(data):
            _warn_repaired(self.where)
            self._fd = open_for_append(self._path)
            os.ftruncate(self._fd, complete)
            os.fsync(self._fd)
            data = data[:complete]
        header, kept, total = _rows_up_to(data, self.where, resume_from_step)
        self._size = len(data)
        if kept is not None and len(kept) < total:
            self._replace(encode_rows(header, kept, header=True))
            fsync_directory(directory)
        self._has_header = bool(header)
        return Start(header, total if kept is None else len(kept), None)

    def write(self, fieldnames: Sequence[str], rows: Sequence[Row], *, new_header: bool) -> None:
        """Append ``rows``; or, with a new header, write the whole file anew with the old rows and these."""
        if new_header or not self._has_header:
            existing: list[dict[str, str]] = []
            if self._has_header:
                with open(self._path, "rb") as handle:
                    existing = _records(handle.read(), self.where)[1]
            self._replace(encode_rows(fieldnames, [*existing, *rows], header=True))
            self._has_header = True
            self._renamed = True
            return
        data = encode_rows(fieldnames, rows, header=False)
        if self._fd is None:
            self._fd = open_for_append(self._path)
        try:
            append_all(self._fd, data)
        except BaseException:
            # never leave a partial row for the next append to glue onto
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)

    def settle(self) -> None:
        """Make the last rename durable (``fsync`` of the directory); the writer calls it once it counted the rows.

        Separate from :meth:`write` so that a failure here, after the new file is in place, cannot make the writer
        write those rows a second time.
        """
        if self._renamed:
            self._renamed = False
            fsync_directory(os.path.dirname(self._path) or ".")

    def close(self) -> None:
        """``fsync`` and close the file."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def discard(self) -> None:
        """Close without syncing (after a failure)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def _replace(self, data: bytes) -> None:
        replace_atomically(self._path, data)
        self.discard()  # the descriptor points to the replaced file
        self._size = len(data)


class PartedFile:
    """A file on a filesystem without append or rename: one new part object per flush, merged on close."""

    def __init__(self, fs: AbstractFileSystem, path: str, where: str) -> None:
        self.where = where
        self._fs = fs
        self._path = path
        self._token = _token(b"")
        self._parts = 0

    def start(self, resume_from_step: int | None) -> Start:
        """Merge what an earlier run left (file and parts) into the file, or into ``<file>.<n>`` for a new run."""
        fs = self._fs
        fs.makedirs(posixpath.dirname(self._path), exist_ok=True)
        base, parts = _base_and_parts(fs, self._path)
        stale = _all_parts(fs, self._path)
        if base is None and not parts:
            _remove(fs, stale)
            return Start([], 0, None)
        if resume_from_step is None:
            rotated = _free_name(self._path, fs.exists)
            header, rows = self._merged(base, parts)
            fs.pipe_file(rotated, encode_rows(header, rows, header=True))
            _remove(fs, [*stale, self._path])
            return Start([], 0, fs.unstrip_protocol(rotated))
        header, rows = self._merged(base, parts)
        kept = [row for row in rows if whole_number(row[STEP], self.where, 0, STEP) <= resume_from_step]
        data = encode_rows(header, kept, header=True) if header else b""
        if data != base:
            fs.pipe_file(self._path, data)
        _remove(fs, stale)
        self._token = _token(data)
        return Start(header, len(kept), None)

    def write(self, fieldnames: Sequence[str], rows: Sequence[Row], *, new_header: bool) -> None:
        """Write ``rows`` under ``fieldnames`` as the next part (a complete CSV object)."""
        name = f"{self._path}.part-{self._token}-{self._parts + 1:08d}"
        try:
            self._fs.pipe_file(name, encode_rows(fieldnames, rows, header=True))
        except BaseException:
            with contextlib.suppress(Exception):
                self._fs.rm(name)
            raise
        self._parts += 1

    def close(self) -> None:
        """Merge the parts into the file, then delete them."""
        if not self._parts:
            return
        base, parts = _base_and_parts(self._fs, self._path)
        header, rows = self._merged(base, parts)
        data = encode_rows(header, rows, header=True)
        self._fs.pipe_file(self._path, data)  # the token changes with the content: the parts are now stale
        self._token, self._parts = _token(data), 0
        _remove(self._fs, [path for path, _ in parts])

    def settle(self) -> None:
        """Nothing to make durable: every part is a complete object once written."""

    def discard(self) -> None:
        """Nothing is held open."""

    def _merged(self, base: bytes | None, parts: list[tuple[str, bytes]]) -> tuple[list[str], list[dict[str, str]]]:
        header: list[str] = []
        rows: list[dict[str, str]] = []
        chunks = ([(self.where, base)] if base is not None else []) + [
            (self._fs.unstrip_protocol(path), data) for path, data in parts
        ]
        for where, data in chunks:
            complete = complete_prefix_length(data)
            if complete < len(data):
                _warn_repaired(where)
            names, records = _records(data[:complete], where)
            header = sorted(set(header).union(names))
            rows += records
        return header, rows


def read_chunks(fs: AbstractFileSystem, path: str, parts: list[str]) -> list[tuple[str, bytes]]:
    """The bytes of a per-rank file and of those of its ``parts`` that extend it, in order, each with its path."""
    base, current = _base_and_parts(fs, path, parts)
    return ([(path, base)] if base is not None else []) + current


def _base_and_parts(
    fs: AbstractFileSystem, path: str, parts: list[str] | None = None
) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    try:
        base: bytes | None = fs.cat_file(path)
    except FileNotFoundError:
        base = None
    token = _token(base or b"")
    names = _all_parts(fs, path) if parts is None else parts
    numbered = sorted((number, name) for name in names for mark, number in [_part_key(name)] if mark == token)
    return base, [(name, fs.cat_file(name)) for _, name in numbered]


def _part_key(name: str) -> tuple[str, int]:
    match = _PART.search(name)
    return ("", 0) if match is None else (match[1], int(match[2]))


def _all_parts(fs: AbstractFileSystem, path: str) -> list[str]:
    found: list[str] = fs.glob(glob_escape(path) + ".part-*")
    prefix = path.rstrip("/").rsplit("/", 1)[-1] + ".part-"
    return [name for name in found if name.rsplit("/", 1)[-1].startswith(prefix) and _PART.search(name)]


def _records(data: bytes, where: str) -> tuple[list[str], list[dict[str, str]]]:
    header, body, first_line = split_header(decode(data, where), where)
    if not header:
        return [], []
    check_header(header, where)
    return header, [
        dict(zip(header, record, strict=True)) for _, record in iter_records(body, header, where, first_line)
    ]


def _rows_up_to(data: bytes, where: str, last_step: int) -> tuple[list[str], list[dict[str, str]] | None, int]:
    """The header, the rows with ``step <= last_step`` (``None`` if that is every row), and the number of rows."""
    header, body, first_line = split_header(decode(data, where), where)
    if not header:
        return [], None, 0
    check_header(header, where)
    records = list(iter_records(body, header, where, first_line))
    at = header.index(STEP)
    kept = [
        dict(zip(header, record, strict=True))
        for line, record in records
        if whole_number(record[at], where, line, STEP) <= last_step
    ]
    return header, (None if len(kept) == len(records) else kept), len(records)


def _token(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _free_name(path: str, exists: Any) -> str:
    number = 1
    while exists(rotated := f"{path}.{number}"):
        number += 1
    return rotated


def _remove(fs: AbstractFileSystem, paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)


def _warn_repaired(where: str) -> None:
    warnings.warn(f"{where}: removed an incomplete last line (a write cut short)", RankMetricsWarning, stacklevel=4)
