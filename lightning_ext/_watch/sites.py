"""Where a call comes from, in the user's code: the first frame outside the libraries, and the Lightning API called."""

from __future__ import annotations

import functools
import sys
import sysconfig
from pathlib import Path
from types import FrameType
from typing import NamedTuple

__all__ = ["Caller", "called_as", "user_frame", "user_site"]

_STDLIB = Path(sysconfig.get_paths()["stdlib"]).as_posix()
_ENTRY_POINTS = ("Trainer.fit", "Trainer.validate", "Trainer.test", "Trainer.predict")


_USER, _LIBRARY, _LIGHTNING = range(3)


@functools.cache
def _kind(filename: str) -> int:
    """What a code file is: the user's, a library's (installed packages, lightning-ext, the standard library), or
    Lightning's; cached, as every counted collective call walks its caller's frames."""
    path = filename.replace("\\", "/")
    if not path.startswith(("<", _STDLIB, *_packages())):
        return _USER
    if "/lightning/" in path or "/pytorch_lightning/" in path or "/lightning_fabric/" in path:
        return _LIGHTNING
    return _LIBRARY


@functools.lru_cache(maxsize=1)
def _packages() -> tuple[str, ...]:
    """torch's site-packages (every installed package), Lightning's (a patched copy may live elsewhere) and
    lightning-ext itself, wherever they live."""
    roots = []
    packages = (("torch", 1), ("lightning", 1), ("pytorch_lightning", 1), ("lightning_ext", 0))
    for module, levels in ((sys.modules.get(name), levels) for name, levels in packages):
        if module is not None and module.__file__ is not None:
            roots.append(Path(module.__file__).parents[levels].as_posix() + "/")
    return tuple(roots)


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame, from ``frame`` outwards, outside the libraries (``None`` if there is none)."""
    while frame is not None and _kind(frame.f_code.co_filename) != _USER:
        frame = frame.f_back
    return frame


def user_site(frame: FrameType | None, default: str | None = "an unknown place") -> str | None:
    """``file:line in function`` of the innermost frame, from ``frame`` outwards, outside the libraries."""
    frame = user_frame(frame)
    if frame is None:
        return default
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class Caller(NamedTuple):
    """Who made a call: the Lightning API the user called, where, and whether it was Lightning's own flow.

    Attributes:
        api: ``"Trainer.log_dir"``; where the user only called ``trainer.fit`` (or ``validate``, ...), the Lightning
            function that made the call too: ``"_FitLoop.setup_data, in Trainer.fit"``; ``None`` for a direct call.
        site: the user's line: ``"model.py:40 in validation_step"`` (``trainer.fit``'s line for Lightning's own flow).
        lightning: whether Lightning's own flow made the call (every rank makes it, in its normal flow).

    """

    api: str | None
    site: str
    lightning: bool


def called_as(frame: FrameType | None) -> Caller:
    """``Caller("Trainer.log_dir", "model.py:40 in validation_step", False)``: the API, the line, whose flow."""
    innermost = outermost = None
    while frame is not None:
        kind = _kind(frame.f_code.co_filename)
        if kind == _USER:
            break
        if kind == _LIGHTNING:
            outermost = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)  # co_qualname: Python 3.11+
            innermost = innermost or outermost
        frame = frame.f_back
    site = (
        "an unknown place"
        if frame is None
        else f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
    )
    if outermost in _ENTRY_POINTS and innermost != outermost:  # Lightning's loops made it: say where in them
        return Caller(f"{innermost}, in {outermost}", site, True)
    if frame is None and innermost is not None:  # no user frame at all: a rank that a launcher started (spawn)
        return Caller(innermost if innermost == outermost else f"{innermost}, in {outermost}", site, True)
    return Caller(outermost, site, False)
