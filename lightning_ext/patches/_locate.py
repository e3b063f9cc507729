"""Find the target ``lightning`` package, its version, and the series written for that version.

The series for Lightning ``X.Y.Z`` lives in ``<repository>/patches/lightning-X.Y.Z/``, where ``<repository>`` is the
directory that holds the ``lightning_ext`` package (a source checkout or an editable install).

"""

import importlib.util
import re
from pathlib import Path

import lightning_ext
from lightning_ext.patches._errors import PatchError

__all__ = ["default_target", "find_series", "patches_root", "resolve_target", "target_version"]

_VERSION_FILE = "version.info"
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+-]*$")
_SERIES_PREFIX = "lightning-"


def patches_root() -> Path:
    """``<repository>/patches``: where the series for each Lightning version live."""
    return Path(lightning_ext.__file__).resolve().parents[1] / "patches"


def default_target() -> Path:
    """The installed ``lightning`` package directory, found without importing it.

    Raises:
        PatchError: Lightning is not installed.

    """
    spec = importlib.util.find_spec("lightning")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise PatchError("the 'lightning' package is not installed here; pass --target DIR")
    return Path(locations[0])


def resolve_target(target: Path | None) -> Path:
    """The target package directory, resolved: ``target``, or the installed ``lightning`` when ``None``.

    Raises:
        PatchError: the directory does not exist or is not a Python package.

    """
    directory = default_target() if target is None else Path(target)
    if not directory.is_dir():
        raise PatchError(f"the target {directory} is not a directory")
    if not (directory / "__init__.py").is_file():
        raise PatchError(f"the target {directory} is not a 'lightning' package directory (no __init__.py)")
    return directory.resolve()


def target_version(target: Path) -> str | None:
    """The Lightning version the target records, or ``None`` if it records none.

    Lightning reads the first line of ``version.info`` next to the package directory, or else inside it (see
    ``lightning/__version__.py``); this reads the same file, without importing anything.

    Raises:
        PatchError: the version file exists but does not hold a version.

    """
    for candidate in (target.parent / _VERSION_FILE, target / _VERSION_FILE):
        if candidate.is_file():
            first = (candidate.read_text(encoding="utf-8").splitlines() or [""])[0].strip()
            if not _VERSION.match(first):
                raise PatchError(f"{candidate} does not start with a version: {first!r}")
            return first
    return None


def find_series(target: Path, *, root: Path | None = None) -> Path:
    """The series directory for the target's Lightning version: ``<root>/lightning-<version>``.

    Args:
        target: the ``lightning`` package directory.
        root: where the series live; :func:`patches_root` by default.

    Raises:
        PatchError: the target records no version, or no series exists for it (the message lists those that do).

    """
    root = patches_root() if root is None else root
    version = target_version(target)
    if version is None:
        raise PatchError(f"cannot tell the Lightning version of {target} (no {_VERSION_FILE}); pass --series DIR")
    series = root / f"{_SERIES_PREFIX}{version}"
    if series.is_dir():
        return series
    available = sorted(path.name for path in root.glob(f"{_SERIES_PREFIX}*") if path.is_dir()) if root.is_dir() else []
    listed = ", ".join(available) if available else "none"
    raise PatchError(
        f"no patch series for Lightning {version}: {series} does not exist (available in {root}: {listed})"
    )
