"""Check, apply and revert the ``git format-patch`` series that writes lightning-ext's seams into Lightning's sources.

``python -m lightning_ext.patches check|apply|revert [--target DIR] [--series DIR]``, or the functions here (see
``patches/README.md``); ``git apply`` does the patch work. :func:`patch_mode` imports Lightning: it loads on first use.
"""

from typing import TYPE_CHECKING, Any

from lightning_ext.patches._api import SeriesNotApplicableError, SeriesReport, apply, check, revert
from lightning_ext.patches._series import PatchError

if TYPE_CHECKING:
    from lightning_ext._runtime import patch_mode

__all__ = ["PatchError", "SeriesNotApplicableError", "SeriesReport", "apply", "check", "patch_mode", "revert"]


def __getattr__(name: str) -> Any:
    if name == "patch_mode":  # imports Lightning: only when asked for
        from lightning_ext._runtime import patch_mode

        return patch_mode
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
