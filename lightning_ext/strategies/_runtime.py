"""Lightning's call sites reach lightning-ext: natively (a patched Lightning) or through wrappers installed here."""

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
from lightning.pytorch.loops.fetchers import _DataFetcher, _PrefetchDataFetcher
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer import call as _call
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection, _ResultMetric

from lightning_ext._packages.choice import strategy_for_other_package
from lightning_ext._per_rank import local_values
from lightning_ext._setup import checks as setup_checks
from lightning_ext.strategies import _compat
from lightning_ext.strategies import _seam_hooks as seam_hooks

__all__ = ["check_trainer_strategies", "install", "patch_mode", "runtime_patching_enabled", "seams_available"]

_MARKER = "__lightning_ext_seam__"
_NATIVE_MARKER = "_LIGHTNING_EXT_SEAM"  # a class attribute that the patch series adds to each patched class
_HOOKS = "_lightning_ext_hooks"  # the module attribute through which a patched Lightning calls seam_hooks
_SETUP_HOOKS = "_lightning_ext_setup_checks"  # and setup_checks (the fetchers module, patch 0005)
_ENV_SWITCH = "LIGHTNING_EXT_RUNTIME_PATCHING"
_DECISIONS, _HANG, _SETUP, _SYNC = 1, 2, 3, 4  # the series level that makes a seam native (0001-0003, 0004, 0005, 0006)

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
    for seams, level in ((_hang_seams(), _HANG), (_sync_seams(), _SYNC)):
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
    seam = (_AcceleratorConnector, "_check_config_and_set_final_flags", _trainer_check_seam)
    if not runtime_patching_enabled() or patch_mode() == "native" or _is_wrapped(seam):
        return
    _compat.check_signatures([seam[:2]])
    wrapper = _trainer_check_seam(_AcceleratorConnector._check_config_and_set_final_flags)
    setattr(wrapper, _MARKER, True)
    _AcceleratorConnector._check_config_and_set_final_flags = wrapper  # type: ignore[method-assign]


def _level(owner: Any) -> int:
    """The series level a class (or, for ``trainer/call.py``, the module) was patched to; 0 when not patched."""
    return int(getattr(owner, _NATIVE_MARKER, 0))


def _is_native(seam: Seam) -> bool:
    """Whether the patched Lightning carries this seam: the decisions' ones came with level 1, the hang checks' with
    level 2 (as did the part of ``_ResultMetric.forward`` that says which value syncs), the set-up checks' with 3, the
    coalesced sync's hook ends and the compiled ``LightningModule.log`` with 4."""
    owner, name, _ = seam
    if (owner, name) == (_DataFetcher, "setup"):
        return _level(owner) >= _SETUP
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


def _all_seams() -> tuple[Seam, ...]:
    return (*_seams(), *_hang_seams(), (_DataFetcher, "setup", _loaders_seam), *_sync_seams())


def _seams() -> tuple[Seam, ...]:
    return (
        (ModelCheckpoint, "_save_topk_checkpoint", _checkpoint_seam),
        (ModelCheckpoint, "on_train_batch_end", _step_checkpoint_seam),
        (EarlyStopping, "_run_early_stopping_check", _early_stopping_seam),
        (_LoggerConnector, "log_metrics", _log_metrics_seam),
        (_ResultMetric, "forward", _forward_seam),
    )


def _hang_seams() -> tuple[Seam, ...]:
    return (
        (_ResultMetric, "compute", _compute_seam),
        (_LoggerConnector, "on_batch_start", _batch_start_seam),
        (_ResultCollection, "metrics", _epoch_metrics_seam),
        (_FitLoop, "setup_data", _fit_data_seam),
        (_EvaluationLoop, "setup_data", _evaluation_data_seam),
        (_EvaluationLoop, "max_batches", _evaluation_batches_seam),
        (_PrefetchDataFetcher, "__next__", _fetch_seam),
        (Trainer, "_run", _run_seam),
    )


def _sync_seams() -> tuple[Seam, ...]:
    return (
        (_call, "_call_lightning_module_hook", _hook_end_seam),
        (_call, "_call_callback_hooks", _hook_end_seam),
        (_call, "_call_strategy_hook", _hook_end_seam),
        (LightningModule, "log", _compiled_log_seam),
    )


def _checkpoint_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _save_topk_checkpoint(self: ModelCheckpoint, trainer: Any, monitor_candidates: dict[str, Any]) -> None:
        hook = getattr(trainer.strategy, "save_topk_with_policy", None)
        if hook is not None and hook(self, trainer, monitor_candidates):
            return
        original(self, trainer, monitor_candidates)

    return _save_topk_checkpoint


def _step_checkpoint_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def on_train_batch_end(self: ModelCheckpoint, trainer: Any, *args: Any, **kwargs: Any) -> None:
        hook = getattr(trainer.strategy, "prepare_topk_decision", None)
        if hook is None:
            original(self, trainer, *args, **kwargs)
            return
        # the stock method fetches the candidates exactly when a save is due: decide there (the patched source calls
        # the hook right after that line)
        fetch = type(self)._monitor_candidates

        def candidates_then_decide(trainer_: Any) -> dict[str, Any]:
            found: dict[str, Any] = fetch(self, trainer_)
            hook(self, trainer_, found)
            return found

        self.__dict__["_monitor_candidates"] = candidates_then_decide  # shadows the method for this call only
        try:
            original(self, trainer, *args, **kwargs)
        finally:
            self.__dict__.pop("_monitor_candidates", None)

    return on_train_batch_end


def _early_stopping_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _run_early_stopping_check(self: EarlyStopping, trainer: Any) -> None:
        hook = getattr(trainer.strategy, "run_early_stopping_with_policy", None)
        if hook is not None and hook(self, trainer):
            return
        original(self, trainer)

    return _run_early_stopping_check


def _log_metrics_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def log_metrics(self: _LoggerConnector, metrics: dict[str, Any], step: Any = None) -> None:
        hook = getattr(self.trainer.strategy, "loggers_for_log_metrics", None)
        if hook is None:
            original(self, metrics, step)
            return
        with _loggers_for_this_call(self.trainer, hook(self.trainer, metrics)):
            original(self, metrics, step)

    return log_metrics


@contextmanager
def _loggers_for_this_call(trainer: Any, loggers: list[Any]) -> Iterator[None]:
    """The stock body logs to ``trainer.loggers``; give it these for one call (the patched body takes them directly)."""
    if loggers == trainer.loggers:
        yield
        return
    own = trainer.loggers
    trainer.loggers = loggers
    try:
        yield
    finally:
        trainer.loggers = own


def _forward_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def forward(self: _ResultMetric, value: Any, batch_size: int) -> None:
        with seam_hooks.syncing(self, "step"):
            original(self, value, batch_size)
        local_values.record_update(self, value)

    return forward


def _compute_seam(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compute(self: _ResultMetric) -> Any:
        with seam_hooks.syncing(self, "epoch"):
            return original(self)

    return compute


def _epoch_metrics_seam(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def metrics(self: _ResultCollection, on_step: bool) -> Any:
        with seam_hooks.epoch_round(self, on_step):
            return original(self, on_step)

    return metrics


def _batch_start_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def on_batch_start(self: _LoggerConnector, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        seam_hooks.batch_started()

    return on_batch_start


def _fit_data_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def setup_data(self: _FitLoop) -> None:
        original(self)
        seam_hooks.after_fit_setup_data(self)

    return setup_data


def _evaluation_data_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def setup_data(self: _EvaluationLoop) -> None:
        original(self)
        seam_hooks.after_eval_setup_data(self)

    return setup_data


def _evaluation_batches_seam(original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    @functools.wraps(original)
    def max_batches(self: _EvaluationLoop) -> list[Any]:
        return seam_hooks.max_batches(self, original(self))

    return max_batches


def _fetch_seam(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __next__(self: _PrefetchDataFetcher) -> Any:
        return seam_hooks.fetch(self, functools.partial(original, self))

    return __next__


def _loaders_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def setup(self: _DataFetcher, combined_loader: Any) -> None:
        setup_checks.before_iteration(combined_loader)  # every loop sets its fetcher up right before iterating
        original(self, combined_loader)

    return setup


def _trainer_check_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _check_config_and_set_final_flags(self: _AcceleratorConnector, strategy: Any, *args: Any, **kw: Any) -> None:
        theirs = getattr(type(strategy), "_lightning_package", None)  # set on PolicyStrategyMixin, per package
        if theirs is not None and theirs != _compat.PACKAGE:
            raise strategy_for_other_package(type(strategy), theirs, _compat.PACKAGE, "this Trainer")
        original(self, strategy, *args, **kw)

    return _check_config_and_set_final_flags


def _hook_end_seam(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call_hook(trainer: Any, hook_name: str, *args: Any, **kwargs: Any) -> Any:
        output = original(trainer, hook_name, *args, **kwargs)
        seam_hooks.hook_ended()  # every rank calls the same hooks in the same order: the values logged in it sync
        return output

    return call_hook


def _compiled_log_seam(original: Callable[..., None]) -> Callable[..., None]:
    """``LightningModule.log`` runs eagerly inside a ``torch.compile``'d module (Lightning #21837): dynamo cannot trace
    it (``InternalTorchDynamoError: AttributeError: 'method' object has no attribute '__dict__'``)."""
    return torch.compiler.disable(original)  # type: ignore[no-untyped-call,no-any-return]


def _run_seam(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _run(self: Trainer, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except BaseException as error:
            hook = getattr(self.strategy, "on_run_failure", None)
            if hook is not None:
                hook(error)  # may raise another rank's error instead, from this one
            raise

    return _run
