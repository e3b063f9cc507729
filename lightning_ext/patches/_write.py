"""Write a set of files all-or-nothing: each through a temporary file and ``os.replace``, rolled back on failure.

Each new content goes to a temporary file in the same directory (so that ``os.replace`` is an atomic rename on the
same file system), with the original file's permission bits. The original bytes stay in memory. If any write fails,
every file already replaced gets its original bytes back, and the error says so: the tree is never left half
patched. A file that changed on disk since it was read is not overwritten (the whole write is rolled back).

"""

import contextlib
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from lightning_ext.patches._errors import PatchError

__all__ = ["write_all"]

_TEMP_SUFFIX = ".lightning-ext-tmp"


def write_all(contents: Mapping[Path, bytes], *, expected: Mapping[Path, bytes]) -> tuple[Path, ...]:
    """Replace each file in ``contents`` whose bytes differ from ``expected``; all of them or none.

    Args:
        contents: the new bytes of each file.
        expected: each file's bytes as read when the new contents were computed.

    Returns:
        The files written, in order.

    Raises:
        PatchError: a file changed on disk since it was read, or a write failed. Every file already replaced has
            been restored to its original bytes first (the message names any that could not be).

    """
    changed = [path for path, data in contents.items() if data != expected[path]]
    written: list[Path] = []
    try:
        for path in changed:
            if path.read_bytes() != expected[path]:
                raise PatchError(f"{path} changed on disk while the series was being applied")
            _replace(path, contents[path])
            written.append(path)
    except (OSError, PatchError) as exc:
        failed = [path for path in reversed(written) if not _restore(path, expected[path])]
        action = f"restored the {len(written) - len(failed)} file(s) already written"
        if failed:
            action += f" but could NOT restore {', '.join(str(path) for path in failed)}"
        raise PatchError(f"writing {changed[len(written)]} failed ({exc}); {action}") from exc
    return tuple(written)


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, give it ``path``'s mode, and rename it over ``path``."""
    mode = stat.S_IMODE(path.stat().st_mode)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMP_SUFFIX)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _restore(path: Path, data: bytes) -> bool:
    """Put ``data`` back into ``path``, atomically if possible, else in place; whether it worked."""
    try:
        _replace(path, data)
        return True
    except OSError:
        pass
    try:
        path.write_bytes(data)
        return path.read_bytes() == data
    except OSError:
        return False
