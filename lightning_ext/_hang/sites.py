"""Where a call comes from, in the user's code: the first frame outside the libraries, and the Lightning API called."""

from __future__ import annotations

import functools
import sys
import sysconfig
from pathlib import Path
from types import FrameType

__all__ = ["called_as", "is_library", "user_site"]

_STDLIB = Path(sysconfig.get_paths()["stdlib"]).as_posix()
_ENTRY_POINTS = ("Trainer.fit", "Trainer.validate", "Trainer.test", "Trainer.predict")


def is_library(path: str) -> bool:
    """Installed packages, lightning-ext and the standard library: not where a user's culprit line is."""
    return path.startswith(("<", _STDLIB, *_packages()))


@functools.lru_cache(maxsize=1)
def _packages() -> tuple[str, ...]:
    """torch's site-packages (every installed package) and lightning-ext itself, wherever it lives."""
    roots = []
    for module, levels in ((sys.modules.get("torch"), 1), (sys.modules.get("lightning_ext"), 0)):
        if module is not None and module.__file__ is not None:
            roots.append(Path(module.__file__).parents[levels].as_posix() + "/")
    return tuple(roots)


def user_site(frame: FrameType | None, default: str | None = "an unknown place") -> str | None:
    """``file:line in function`` of the innermost frame, from ``frame`` outwards, outside the libraries."""
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if not is_library(path):
            return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return default


def called_as(frame: FrameType | None) -> tuple[str | None, str]:
    """``("Trainer.log_dir", "model.py:40 in validation_step")``: the Lightning API the user called, and where.

    Where the user only called ``trainer.fit`` (or ``validate``, ...), the Lightning function that made the call is
    named too: ``"_TrainingEpochLoop._broadcast_sigterm_tensor, in Trainer.fit"``.
    """
    innermost = outermost = None
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if not is_library(path):
            break
        if "/lightning/" in path or "/pytorch_lightning/" in path or "/lightning_fabric/" in path:
            outermost = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)  # co_qualname: Python 3.11+
            innermost = innermost or outermost
        frame = frame.f_back
    site = (
        "an unknown place"
        if frame is None
        else f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
    )
    if outermost in _ENTRY_POINTS and innermost != outermost:  # Lightning's loops made it: say where in them
        return f"{innermost}, in {outermost}", site
    return outermost, site
