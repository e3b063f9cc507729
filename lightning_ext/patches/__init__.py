"""Check, apply and revert the patch series that writes lightning-ext's seams into Lightning's sources.

``python -m lightning_ext.patches check|apply|revert`` (``patches/README.md``). Importing it does not import Lightning.
"""

import importlib
from typing import Literal

from lightning_ext._packages.choice import Package, module_for, package_for_caller
from lightning_ext.errors import PatchError, SeriesNotApplicableError
from lightning_ext.patches._tool import SeriesReport, apply, check, revert

__all__ = ["PatchError", "SeriesNotApplicableError", "SeriesReport", "apply", "check", "patch_mode", "revert"]


def patch_mode(package: Package | None = None) -> Literal["native", "runtime"]:
    """``"native"`` when ``package`` carries every seam of the series, else ``"runtime"``; imports it.

    ``package`` is ``"lightning"`` or ``"pytorch_lightning"``; by default the one imported (``lightning`` if both are,
    or neither).
    """
    runtime = module_for("lightning_ext.strategies._runtime", package or package_for_caller(None))
    mode: Literal["native", "runtime"] = importlib.import_module(runtime).patch_mode()  # Lightning: only when asked
    return mode
