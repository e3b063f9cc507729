"""Lightning's call sites delegate to lightning-ext: natively (a patched Lightning) or through wrappers installed here.

A seam is a small guard at the top of a Lightning method: when ``trainer.strategy`` carries a decision policy, the
lightning-ext function runs and the stock body only if it declines. ``patches/`` writes the guards into Lightning's
sources; on an unpatched Lightning, :func:`install` wraps the same methods at run time with the same guards. Either
way the wrappers do nothing for strategies without a policy, so stock strategies behave exactly as before.

Set ``LIGHTNING_EXT_RUNTIME_PATCHING=0`` to forbid the wrappers (used to prove that a patched Lightning works alone).
"""

import functools
import os
from collections.abc import Callable
from typing import Any, Literal

from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from lightning_ext import decisions
from lightning_ext.policies import DecisionPolicy

__all__ = ["install", "patch_mode", "runtime_patching_enabled", "seams_available"]

_MARKER = "__lightning_ext_seam__"
_NATIVE_MARKER = "_LIGHTNING_EXT_SEAM"  # a class attribute that the patch series adds to each patched class
_ENV_SWITCH = "LIGHTNING_EXT_RUNTIME_PATCHING"


def patch_mode() -> Literal["native", "runtime"]:
    """``"native"`` if the installed Lightning carries lightning-ext's seams (``patches/`` applied), else ``"runtime"``.

    Example:
        >>> patch_mode() in ("native", "runtime")
        True

    """
    return "native" if all(hasattr(owner, _NATIVE_MARKER) for owner in _seam_owners()) else "runtime"


def runtime_patching_enabled() -> bool:
    """Whether wrappers may be installed (``LIGHTNING_EXT_RUNTIME_PATCHING`` is not ``0``/``false``/``no``/``off``)."""
    return os.environ.get(_ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def seams_available() -> bool:
    """Whether Lightning's call sites reach lightning-ext, natively or through installed wrappers."""
    if patch_mode() == "native":
        return True
    return all(getattr(getattr(owner, name), _MARKER, False) for owner, name, _ in _runtime_seams())


def install() -> None:
    """Install the runtime seams, once; nothing on a patched Lightning or when runtime patching is switched off."""
    if patch_mode() == "native" or not runtime_patching_enabled():
        return
    for owner, name, make in _runtime_seams():
        current = getattr(owner, name)
        if not getattr(current, _MARKER, False):
            setattr(owner, name, make(current))


def _seam_owners() -> tuple[type, ...]:
    return (ModelCheckpoint, EarlyStopping)


def _runtime_seams() -> tuple[tuple[type, str, Callable[[Any], Any]], ...]:
    return (
        (ModelCheckpoint, "_save_topk_checkpoint", _checkpoint_seam),
        (EarlyStopping, "_run_early_stopping_check", _early_stopping_seam),
    )


def _has_policy(trainer: Any, attribute: str) -> bool:
    return isinstance(getattr(trainer.strategy, attribute, None), DecisionPolicy)


def _checkpoint_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _save_topk_checkpoint(self: ModelCheckpoint, trainer: Any, monitor_candidates: dict[str, Any]) -> None:
        if _has_policy(trainer, "checkpoint_policy") and decisions.save_topk_checkpoint(
            self, trainer, monitor_candidates
        ):
            return
        original(self, trainer, monitor_candidates)

    setattr(_save_topk_checkpoint, _MARKER, True)
    return _save_topk_checkpoint


def _early_stopping_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _run_early_stopping_check(self: EarlyStopping, trainer: Any) -> None:
        if _has_policy(trainer, "early_stopping_policy") and decisions.run_early_stopping_check(self, trainer):
            return
        original(self, trainer)

    setattr(_run_early_stopping_check, _MARKER, True)
    return _run_early_stopping_check
