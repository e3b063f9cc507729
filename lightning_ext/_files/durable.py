"""Crash-safe operations on small append-only files: appends, atomic replacement, torn-tail repair."""

import contextlib
import os

__all__ = ["append_all", "complete_prefix_length", "fsync_directory", "open_for_append", "replace_atomically"]

StrPath = str | os.PathLike[str]

# binary mode matters on Windows only; elsewhere the flag does not exist
_BINARY = getattr(os, "O_BINARY", 0)


def open_for_append(path: StrPath) -> int:
    """Open (creating if needed) ``path`` for appending and return the descriptor.

    ``O_APPEND`` makes the kernel place every write at the end of the file, whatever else moved the offset.
    """
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _BINARY, 0o666)


def append_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``: one ``os.write``, and more only if the kernel accepted fewer bytes.

    Args:
        fd: a descriptor from :func:`open_for_append`.
        data: the encoded lines, each ending with its line terminator.

    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def replace_atomically(path: StrPath, data: bytes) -> None:
    """Make ``data`` the content of ``path``; after a crash at any point the file holds the old or the new content.

    The data goes to a temporary file in the same directory (so the rename stays on one file system), which is
    ``fsync``-ed, then renamed over ``path`` with ``os.replace``. Call :func:`fsync_directory` afterwards to make
    the rename survive a power cut (it is separate so that the caller can first record that the new content is in
    place). If an error interrupts the steps before the rename, the temporary file is removed and ``path`` is
    untouched. A hard crash before the rename can leave the temporary file (``.<name>.<pid>.tmp``) behind; it is
    never read.

    Args:
        path: the file to replace; it need not exist.
        data: its complete new content.

    """
    directory, name = os.path.split(os.fspath(path))
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _BINARY, 0o666)
    try:
        try:
            append_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def fsync_directory(directory: StrPath) -> None:
    """Make the latest creations and renames in ``directory`` durable (POSIX only: Windows cannot open a folder)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_prefix_length(data: bytes) -> int:
    """The length of the part of ``data`` that ends with a complete line (0 if no line is complete).

    Anything after the last ``\\n`` is a line that a write cut short.

    Example:
        >>> complete_prefix_length(b"a,step\\r\\n1,0\\r\\n2,")
        13
        >>> complete_prefix_length(b"a,step\\r\\n")
        8

    """
    return data.rfind(b"\n") + 1
