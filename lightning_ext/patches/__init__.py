"""Check, apply and revert the fork-style patch series that writes lightning-ext's seams into Lightning's sources.

A series is a directory of ``git format-patch`` files, ``0001-*.patch``, ``0002-*.patch``, ..., applied in file-name
order to a ``lightning`` package directory (the installed one by default). By default the series is
``<repository>/patches/lightning-<version>/`` for the target's Lightning version.

* :func:`check` simulates the whole series in memory and reports hunk by hunk (``OK``, ``OK (offset +N lines)``,
  ``ALREADY APPLIED``, ``FAILS`` with the first mismatching line).
* :func:`apply` writes all of it or nothing, and does nothing if it is already applied; it refuses a partially
  patched tree.
* :func:`revert` restores the original files byte for byte, all of them or none.

The same from a shell: ``python -m lightning_ext.patches check|apply|revert [--target DIR] [--series DIR]``.

Example:
    >>> from lightning_ext import patches
    >>> report = patches.check(target="/path/to/site-packages/lightning")  # doctest: +SKIP
    >>> print(report.format())  # doctest: +SKIP

"""

from lightning_ext.patches._api import PatchOutcome, apply, check, revert
from lightning_ext.patches._errors import PatchError, SeriesNotApplicableError
from lightning_ext.patches._locate import default_target, find_series, patches_root, target_version
from lightning_ext.patches._report import HunkReport, HunkStatus, Mismatch, PatchReport, SeriesReport, SeriesState

__all__ = [
    "HunkReport",
    "HunkStatus",
    "Mismatch",
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
    "patches_root",
    "revert",
    "target_version",
]
