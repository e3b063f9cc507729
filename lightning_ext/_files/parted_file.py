"""A per-rank file on a filesystem without append, rename or ``fsync`` (object stores): one part per flush."""

import contextlib
import hashlib
import posixpath
import re
from collections.abc import Sequence

from fsspec import AbstractFileSystem

from lightning_ext._files.csv_format import STEP, encode_rows, whole_number
from lightning_ext._files.durable import complete_prefix_length
from lightning_ext._files.storage import Row, Start, free_name, glob_escape, guarded, records, warn_repaired

__all__ = ["PartedFile", "read_chunks"]

_PART = re.compile(r"\.part-([0-9a-f]{16})-([0-9]+)$")


class PartedFile:
    """A file on a filesystem without append or rename: one new part object per flush, merged on close.

    Example:
        >>> import fsspec
        >>> fs = fsspec.filesystem("memory")
        >>> file = PartedFile(fs, "/doc/metrics.csv", "memory:///doc/metrics.csv")
        >>> file.start(None).rows
        0
        >>> file.write(["loss", "step"], [{"loss": 0.5, "step": 0}], new_header=True)
        >>> [name.rsplit("/", 1)[1] for name in fs.find("/doc")]  # token: the digest of no file yet
        ['metrics.csv.part-e4a6a0577479b2b4-00000001']
        >>> hashlib.blake2b(b"", digest_size=8).hexdigest()
        'e4a6a0577479b2b4'
        >>> file.close()
        >>> fs.cat_file("/doc/metrics.csv")
        b'loss,step\\r\\n0.5,0\\r\\n'
        >>> fs.rm("/doc", recursive=True)

    """

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
            rotated = free_name(self._path, fs.exists)
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
            with guarded():  # a part half written goes if it can; the error raised is the write's
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
                warn_repaired(where)
            names, found = records(data[:complete], where)
            header = sorted(set(header).union(names))
            rows += found
        return header, rows


def read_chunks(fs: AbstractFileSystem, path: str, parts: list[str] | None = None) -> list[tuple[str, bytes]]:
    """The bytes of a file and of those of its ``parts`` that extend it, in order, each with its path (``parts``:
    as listed already; ``None``: listed here)."""
    base, current = _base_and_parts(fs, path, parts)
    return ([(path, base)] if base is not None else []) + current


def _base_and_parts(
    fs: AbstractFileSystem, path: str, parts: list[str] | None = None
) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    try:
        base: bytes | None = fs.cat_file(path)
    except FileNotFoundError:
        base = None
    names = _all_parts(fs, path) if parts is None else parts
    if not names:
        return base, []  # no digest of the file to compute (it is the whole of a large file)
    token = _token(base or b"")
    numbered = sorted((number, name) for name in names for mark, number in [_part_key(name)] if mark == token)
    return base, [(name, fs.cat_file(name)) for _, name in numbered]


def _part_key(name: str) -> tuple[str, int]:
    match = _PART.search(name)
    return ("", 0) if match is None else (match[1], int(match[2]))


def _all_parts(fs: AbstractFileSystem, path: str) -> list[str]:
    found: list[str] = fs.glob(glob_escape(path) + ".part-*")
    prefix = path.rstrip("/").rsplit("/", 1)[-1] + ".part-"
    return [name for name in found if name.rsplit("/", 1)[-1].startswith(prefix) and _PART.search(name)]


def _token(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _remove(fs: AbstractFileSystem, paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)
