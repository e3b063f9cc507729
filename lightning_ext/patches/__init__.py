"""Check, apply and revert the ``git format-patch`` series that writes lightning-ext's seams into Lightning's sources.

The series for Lightning ``X.Y.Z`` (``lightning-X.Y.Z/0001-*.patch``, ...) ships inside the package; ``git apply``
(git must be on ``PATH``) does the patch work. From a shell:
``python -m lightning_ext.patches check|apply|revert [--target DIR] [--series DIR]``.

* :func:`check` reports hunk by hunk (``OK``, ``OK (offset +N lines)``, ``ALREADY APPLIED``, ``FAILS`` with where and
  why) and writes nothing.
* :func:`apply` writes all of the series or nothing, does nothing on a patched tree, and refuses a partial one.
* :func:`revert` restores the original bytes.
* :func:`patch_mode` says whether the Lightning in use is patched (``"native"``) or not (``"runtime"``); it imports
  Lightning, so it loads on first use.

Example:
    >>> from lightning_ext import patches
    >>> print(patches.check(target="/path/to/site-packages/lightning").format())  # doctest: +SKIP

"""

from typing import TYPE_CHECKING, Any

from lightning_ext.patches._api import PatchOutcome, apply, check, revert
from lightning_ext.patches._report import (
    HunkReport,
    HunkStatus,
    PatchReport,
    SeriesNotApplicableError,
    SeriesReport,
    SeriesState,
)
from lightning_ext.patches._series import PatchError, default_target, find_series, patches_root, target_version

if TYPE_CHECKING:
    from lightning_ext._runtime import patch_mode

__all__ = [
    "HunkReport",
    "HunkStatus",
    "PatchError",
    "PatchOutcome",
    "PatchReport",
    "SeriesNotApplicableError",
    "SeriesReport",
    "SeriesState",
    "apply",
    "check",
    "default_target",
    "find_series",
    "patch_mode",
    "patches_root",
    "revert",
    "target_version",
]


def __getattr__(name: str) -> Any:
    if name == "patch_mode":  # imports Lightning: only when asked for
        from lightning_ext._runtime import patch_mode

        return patch_mode
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
