"""Check, apply and revert the patch series that writes lightning-ext's seams into Lightning's sources.

``python -m lightning_ext.patches check|apply|revert`` (``patches/README.md``). Importing it does not import Lightning.
"""

from typing import Literal

from lightning_ext.errors import PatchError, SeriesNotApplicableError
from lightning_ext.patches._tool import SeriesReport, apply, check, revert

__all__ = ["PatchError", "SeriesNotApplicableError", "SeriesReport", "apply", "check", "patch_mode", "revert"]


def patch_mode() -> Literal["native", "runtime"]:
    """``"native"`` when the imported Lightning carries every seam of the series, else ``"runtime"``; imports it."""
    from lightning_ext.strategies._runtime import patch_mode as mode  # Lightning and torch: only when asked

    return mode()
