"""Where a per-rank file lives (a path or an fsspec URL), and the local file written durably."""

import contextlib
import os
import posixpath
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from lightning_ext._files.csv_format import (
    STEP,
    Cell,
    check_header,
    decode,
    encode_rows,
    iter_records,
    split_header,
    whole_number,
)
from lightning_ext._files.durable import (
    append_all,
    complete_prefix_length,
    fsync_directory,
    open_for_append,
    replace_atomically,
)
from lightning_ext.errors import RankMetricsWarning

__all__ = [
    "Failure",
    "LocalFile",
    "Row",
    "Start",
    "free_name",
    "glob_escape",
    "guarded",
    "join",
    "records",
    "split_location",
    "warn_repaired",
    "write_whole",
]

Row = Mapping[str, Cell]


@dataclass(frozen=True)
class Start:
    """What a storage found when it opened: the header in place, the rows kept, where an old file was moved."""

    fieldnames: list[str]
    rows: int
    rotated_to: str | None


@dataclass
class Failure:
    """What failed in a :func:`guarded` block, if anything."""

    error: Exception | None = None


@contextlib.contextmanager
def guarded() -> Iterator[Failure]:
    """A diagnostic's work: whatever fails in the block is kept in the :class:`Failure` it yields, not raised; the
    caller then stops that output and warns once (a diagnostic never ends a training run).

    Example:
        >>> with guarded() as failure:
        ...     open("/no/such/dir/metrics.csv", "w")
        >>> type(failure.error).__name__
        'FileNotFoundError'

    """
    failure = Failure()
    try:
        yield failure
    except Exception as error:  # guards a diagnostic's files (per-rank CSV, TensorBoard events, telemetry, the decision
        # record, markers) and the Lightning state it reads for them. Nothing narrower: an fsspec filesystem raises
        # its own classes (s3fs, gcsfs and adlfs raise theirs, not OSError alone), and Lightning's private state
        # changes between releases; whatever it is, the output stops with a warning naming it, and training goes on
        failure.error = error


def split_location(location: str | os.PathLike[str]) -> tuple[AbstractFileSystem, str, bool]:
    """``(filesystem, path on it, is local)``; a plain path stays as given (relative paths stay relative).

    Example:
        >>> split_location("file:///tmp/x.csv")[1:]
        ('/tmp/x.csv', True)

    """
    text = os.fspath(location)
    if "://" not in text and "::" not in text:
        return LocalFileSystem(), text, True
    fs, path = url_to_fs(text)
    return fs, path, isinstance(fs, LocalFileSystem)


def join(base: str, relative: str) -> str:
    """``relative`` under ``base``: ``/``-joined for a URL, ``os.path.join`` for a local path.

    Example:
        >>> join("s3://bucket/logs", "rank_0/metrics.csv")
        's3://bucket/logs/rank_0/metrics.csv'

    """
    if "://" in base:
        return posixpath.join(base, relative)
    return os.path.join(base, relative)


def glob_escape(text: str) -> str:
    """``text`` with the glob characters ``*?[`` made literal."""
    return re.sub(r"([*?[])", r"[\1]", text)


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
            rotated = free_name(self._path, os.path.lexists)
            os.rename(self._path, rotated)
            fsync_directory(directory)
            return Start([], 0, rotated)
        with open(self._path, "rb") as handle:
            data = handle.read()
        complete = complete_prefix_length(data)
        if complete < len(data):
            warn_repaired(self.where)
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
                    existing = records(handle.read(), self.where)[1]
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


def records(data: bytes, where: str) -> tuple[list[str], list[dict[str, str]]]:
    """A file's (or part's) header and rows, each row a dict of its cells as written."""
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


def free_name(path: str, exists: Any) -> str:
    """``<path>.<n>``, the first ``n`` from 1 that ``exists`` says is free (where an old file is moved)."""
    number = 1
    while exists(rotated := f"{path}.{number}"):
        number += 1
    return rotated


def warn_repaired(where: str) -> None:
    """Say that a torn last line was removed."""
    warnings.warn(f"{where}: removed an incomplete last line (a write cut short)", RankMetricsWarning, stacklevel=4)
