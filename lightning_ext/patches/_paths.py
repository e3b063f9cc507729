"""Map the paths written in a patch to files inside the target ``lightning`` package, and refuse any that escape it.

A patch names ``a/lightning/pytorch/callbacks/model_checkpoint.py`` (and ``b/...``). The ``a/`` or ``b/`` prefix and
the leading ``lightning/`` component are dropped; the rest is a path inside the target package directory.

Example:
    >>> package_path("a/lightning/pytorch/callbacks/model_checkpoint.py", patch="0001-x.patch")
    PurePosixPath('pytorch/callbacks/model_checkpoint.py')
    >>> package_path("b/lightning/../../etc/x", patch="0001-x.patch")
    Traceback (most recent call last):
    ...
    lightning_ext.patches._errors.PatchError: 0001-x.patch: refusing path 'b/lightning/../../etc/x': it contains '..'

"""

from pathlib import Path, PurePosixPath

from lightning_ext.patches._errors import PatchError

__all__ = ["package_path", "resolve_in_target"]

_PACKAGE = "lightning"


def package_path(raw: str, *, patch: str) -> PurePosixPath:
    """The path, relative to the ``lightning`` package, that a patch header names.

    Args:
        raw: the path as written in the patch (``a/lightning/...`` or ``b/lightning/...``).
        patch: the patch file name, for error messages.

    Raises:
        PatchError: the path is quoted, absolute, contains ``..``, lacks the ``a/``/``b/`` prefix, or is not inside
            ``lightning/``.

    """
    refuse = f"{patch}: refusing path {raw!r}"
    if raw.startswith('"'):
        raise PatchError(f"{refuse}: quoted (escaped) file names are not supported")
    if raw.startswith("/"):
        raise PatchError(f"{refuse}: it is absolute")
    if raw[:2] not in ("a/", "b/"):
        raise PatchError(f"{refuse}: expected an 'a/' or 'b/' prefix (git format-patch output)")
    rest = raw[2:]
    if rest.startswith("/"):
        raise PatchError(f"{refuse}: it is absolute")
    if "\\" in rest:
        raise PatchError(f"{refuse}: backslashes in paths are not supported")
    parts = PurePosixPath(rest).parts
    if ".." in parts:
        raise PatchError(f"{refuse}: it contains '..'")
    if len(parts) < 2 or parts[0] != _PACKAGE:
        raise PatchError(f"{refuse}: it is not a file inside '{_PACKAGE}/'")
    return PurePosixPath(*parts[1:])


def resolve_in_target(target: Path, relative: PurePosixPath, *, patch: str) -> Path:
    """The real file that a package-relative path names inside ``target``, following symlinks.

    Args:
        target: the ``lightning`` package directory, already resolved.
        relative: a path from :func:`package_path`.
        patch: the patch file name, for error messages.

    Raises:
        PatchError: the path resolves outside ``target`` (through a symlink), or is not an existing regular file.

    """
    shown = f"{_PACKAGE}/{relative}"
    resolved = (target / relative).resolve()
    if not resolved.is_relative_to(target):
        raise PatchError(f"{patch}: refusing path {shown!r}: it resolves outside the target {target} (to {resolved})")
    if not resolved.is_file():
        raise PatchError(f"{patch}: {shown} is not a file in the target {target} (creating files is not supported)")
    return resolved
