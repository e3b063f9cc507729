"""Lightning's call sites reach lightning-ext: natively (a patched Lightning) or through wrappers installed here."""

import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
from lightning.pytorch.loops.fetchers import _DataFetcher, _PrefetchDataFetcher
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.prediction_loop import _PredictionLoop
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer import call as _call
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection, _ResultMetric

from lightning_ext._setup import checks as setup_checks
from lightning_ext.strategies import _compat
from lightning_ext.strategies import _seam_hooks as seam_hooks
from lightning_ext.strategies import _wrappers as wrappers

__all__ = ["check_trainer_strategies", "install", "patch_mode", "runtime_patching_enabled", "seams_available"]

_MARKER = "__lightning_ext_seam__"
_NATIVE_MARKER = "_LIGHTNING_EXT_SEAM"  # a class attribute that the patch series adds to each patched class
_HOOKS = "_lightning_ext_hooks"  # the module attribute through which a patched Lightning calls seam_hooks
_SETUP_HOOKS = "_lightning_ext_setup_checks"  # and setup_checks (the fetchers module, patch 0005)
_ENV_SWITCH = "LIGHTNING_EXT_RUNTIME_PATCHING"
# the series level that makes a seam native: 0001-0003, 0004, 0005, 0006, 0007
_DECISIONS, _HANG, _SETUP, _SYNC, _STOP = 1, 2, 3, 4, 5

Seam = tuple[Any, str, Callable[[Any], Any]]  # (the class or module that holds it, the attribute, the wrapper maker)


def patch_mode() -> Literal["native", "runtime"]:
    """``"native"`` if the installed Lightning carries every seam (the whole series applied), else ``"runtime"``.

    Example:
        >>> patch_mode() in ("native", "runtime")
        True

    """
    native = _level(ParallelStrategy) >= _DECISIONS and all(_is_native(seam) for seam in _all_seams())
    return "native" if native else "runtime"


def runtime_patching_enabled() -> bool:
    """Whether wrappers may be installed (``LIGHTNING_EXT_RUNTIME_PATCHING`` is not ``0``/``false``/``no``/``off``)."""
    return os.environ.get(_ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def seams_available() -> bool:
    """Whether Lightning's call sites reach lightning-ext, natively or through installed wrappers."""
    return all(_is_native(seam) or _is_wrapped(seam) for seam in _all_seams())


def install() -> None:
    """Connect the native seams and install the missing ones at run time (idempotent); warn once if not verified.

    Nothing is wrapped on a patched Lightning, nor when runtime patching is switched off.

    Raises:
        RuntimeError: a Lightning method lightning-ext wraps or calls has another signature than it was written for
            (before anything is wrapped).

    """
    _compat.warn_if_unverified()
    for seams, level in ((_hang_seams(), _HANG), (_sync_seams(), _SYNC), (_stop_seams(), _STOP)):
        for owner, _, _ in seams:
            module = owner if isinstance(owner, ModuleType) else sys.modules.get(owner.__module__)
            if _level(owner) >= level and module is not None and hasattr(module, _HOOKS):
                setattr(module, _HOOKS, seam_hooks)
    fetchers = sys.modules.get(_DataFetcher.__module__)
    if _level(_DataFetcher) >= _SETUP and fetchers is not None and hasattr(fetchers, _SETUP_HOOKS):
        setattr(fetchers, _SETUP_HOOKS, setup_checks)
    pending = [seam for seam in _all_seams() if not _is_native(seam) and not _is_wrapped(seam)]
    if runtime_patching_enabled():
        _compat.check_signatures([(owner, name) for owner, name, _ in pending])
    _compat.check_signatures(_compat.CALLED)
    if not runtime_patching_enabled():
        return
    for owner, name, make in pending:
        current = vars(owner).get(name, getattr(owner, name))
        if isinstance(current, property) and current.fget is not None:
            getter = make(current.fget)
            setattr(getter, _MARKER, True)
            setattr(owner, name, property(getter, current.fset, current.fdel, current.__doc__))
        else:
            wrapper = make(current)
            setattr(wrapper, _MARKER, True)
            setattr(owner, name, wrapper)


def check_trainer_strategies() -> None:
    """Have this package's Trainer name lightning-ext's strategy of the other Lightning package (idempotent).

    Stock Lightning refuses it as "an invalid strategy name"; the wrapper raises
    :class:`~lightning_ext.errors.LightningPackageMismatchError` with the fix, and leaves everything else to the stock
    method. Not a seam of the patch series: installed when the package is imported, unless runtime patching is off or
    the package is patched (then nothing is wrapped, and Lightning's own error stands).
    """
    seam = (_AcceleratorConnector, "_check_config_and_set_final_flags", wrappers.trainer_check_seam)
    if not runtime_patching_enabled() or patch_mode() == "native" or _is_wrapped(seam):
        return
    _compat.check_signatures([seam[:2]])
    wrapper = wrappers.trainer_check_seam(_AcceleratorConnector._check_config_and_set_final_flags)
    setattr(wrapper, _MARKER, True)
    _AcceleratorConnector._check_config_and_set_final_flags = wrapper  # type: ignore[method-assign]


def _level(owner: Any) -> int:
    """The series level a class (or, for ``trainer/call.py``, the module) was patched to; 0 when not patched."""
    return int(getattr(owner, _NATIVE_MARKER, 0))


def _is_native(seam: Seam) -> bool:
    """Whether the patched Lightning carries this seam: the decisions' ones came with level 1, the hang checks' with
    level 2 (as did the part of ``_ResultMetric.forward`` that says which value syncs), the set-up checks' with 3, the
    coalesced sync's hook ends and the compiled ``LightningModule.log`` with 4, and with 5 the sync after each
    callback, the trainer's metrics read while values are pending, and each evaluation and prediction batch's end."""
    owner, name, _ = seam
    if (owner, name) == (_DataFetcher, "setup"):
        return _level(owner) >= _SETUP
    if (owner, name) in _LEVEL_5_SEAMS:
        return _level(owner) >= _STOP
    if owner is _call or owner is LightningModule:
        return _level(owner) >= _SYNC
    decisions_only = (owner, name) in _LEVEL_1_SEAMS
    return _level(owner) >= (_DECISIONS if decisions_only else _HANG)


def _is_wrapped(seam: Seam) -> bool:
    owner, name, _ = seam
    current = vars(owner).get(name, getattr(owner, name, None))
    function = current.fget if isinstance(current, property) else current
    return bool(getattr(function, _MARKER, False))


_LEVEL_1_SEAMS = frozenset(
    {
        (ModelCheckpoint, "_save_topk_checkpoint"),
        (ModelCheckpoint, "on_train_batch_end"),
        (EarlyStopping, "_run_early_stopping_check"),
        (_LoggerConnector, "log_metrics"),
    }
)


_LEVEL_5_SEAMS = frozenset(
    {
        (_call, "_call_callback_hooks"),
        (Trainer, "callback_metrics"),
        (Trainer, "logged_metrics"),
        (Trainer, "progress_bar_metrics"),
        (_EvaluationLoop, "_evaluation_step"),
        (_PredictionLoop, "_predict_step"),
    }
)


def _all_seams() -> tuple[Seam, ...]:
    loaders = (_DataFetcher, "setup", wrappers.loaders_seam)
    return (*_seams(), *_hang_seams(), loaders, *_sync_seams(), *_stop_seams())


def _seams() -> tuple[Seam, ...]:
    return (
        (ModelCheckpoint, "_save_topk_checkpoint", wrappers.checkpoint_seam),
        (ModelCheckpoint, "on_train_batch_end", wrappers.step_checkpoint_seam),
        (EarlyStopping, "_run_early_stopping_check", wrappers.early_stopping_seam),
        (_LoggerConnector, "log_metrics", wrappers.log_metrics_seam),
        (_ResultMetric, "forward", wrappers.forward_seam),
    )


def _hang_seams() -> tuple[Seam, ...]:
    return (
        (_ResultMetric, "compute", wrappers.compute_seam),
        (_LoggerConnector, "on_batch_start", wrappers.batch_start_seam),
        (_ResultCollection, "metrics", wrappers.epoch_metrics_seam),
        (_FitLoop, "setup_data", wrappers.fit_data_seam),
        (_EvaluationLoop, "setup_data", wrappers.evaluation_data_seam),
        (_EvaluationLoop, "max_batches", wrappers.evaluation_batches_seam),
        (_PrefetchDataFetcher, "__next__", wrappers.fetch_seam),
        (Trainer, "_run", wrappers.run_seam),
    )


def _sync_seams() -> tuple[Seam, ...]:
    return (
        (_call, "_call_lightning_module_hook", wrappers.hook_end_seam),
        (_call, "_call_callback_hooks", wrappers.callback_hooks_seam),
        (_call, "_call_strategy_hook", wrappers.hook_end_seam),
        (LightningModule, "log", wrappers.compiled_log_seam),
    )


def _stop_seams() -> tuple[Seam, ...]:
    return (
        (Trainer, "callback_metrics", wrappers.metrics_read_seam),
        (Trainer, "logged_metrics", wrappers.metrics_read_seam),
        (Trainer, "progress_bar_metrics", wrappers.metrics_read_seam),
        (_EvaluationLoop, "_evaluation_step", wrappers.evaluation_batch_seam),
        (_PredictionLoop, "_predict_step", wrappers.evaluation_batch_seam),
    )
