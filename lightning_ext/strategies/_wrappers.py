"""The wrappers ``_runtime`` installs on an unpatched Lightning: its call sites reach lightning-ext through them."""

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
from lightning.pytorch.loops.fetchers import _DataFetcher, _PrefetchDataFetcher
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection, _ResultMetric

from lightning_ext._packages.choice import strategy_for_other_package
from lightning_ext._per_rank import local_values
from lightning_ext._setup import checks as setup_checks
from lightning_ext.strategies import _compat
from lightning_ext.strategies import _seam_hooks as seam_hooks


def checkpoint_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _save_topk_checkpoint(self: ModelCheckpoint, trainer: Any, monitor_candidates: dict[str, Any]) -> None:
        hook = getattr(trainer.strategy, "save_topk_with_policy", None)
        if hook is not None and hook(self, trainer, monitor_candidates):
            return
        original(self, trainer, monitor_candidates)

    return _save_topk_checkpoint


def step_checkpoint_seam(original: Callable[..., None]) -> Callable[..., None]:
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


def early_stopping_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _run_early_stopping_check(self: EarlyStopping, trainer: Any) -> None:
        hook = getattr(trainer.strategy, "run_early_stopping_with_policy", None)
        if hook is not None and hook(self, trainer):
            return
        original(self, trainer)

    return _run_early_stopping_check


def log_metrics_seam(original: Callable[..., None]) -> Callable[..., None]:
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


def forward_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def forward(self: _ResultMetric, value: Any, batch_size: int) -> None:
        with seam_hooks.syncing(self, "step"):
            original(self, value, batch_size)
        local_values.record_update(self, value)

    return forward


def compute_seam(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compute(self: _ResultMetric) -> Any:
        with seam_hooks.syncing(self, "epoch"):
            return original(self)

    return compute


def epoch_metrics_seam(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def metrics(self: _ResultCollection, on_step: bool) -> Any:
        with seam_hooks.epoch_round(self, on_step):
            return original(self, on_step)

    return metrics


def batch_start_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def on_batch_start(self: _LoggerConnector, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        seam_hooks.batch_started()

    return on_batch_start


def fit_data_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def setup_data(self: _FitLoop) -> None:
        original(self)
        seam_hooks.after_fit_setup_data(self)

    return setup_data


def evaluation_data_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def setup_data(self: _EvaluationLoop) -> None:
        original(self)
        seam_hooks.after_eval_setup_data(self)

    return setup_data


def evaluation_batches_seam(original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    @functools.wraps(original)
    def max_batches(self: _EvaluationLoop) -> list[Any]:
        return seam_hooks.max_batches(self, original(self))

    return max_batches


def fetch_seam(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __next__(self: _PrefetchDataFetcher) -> Any:
        return seam_hooks.fetch(self, functools.partial(original, self))

    return __next__


def loaders_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def setup(self: _DataFetcher, combined_loader: Any) -> None:
        setup_checks.before_iteration(combined_loader)  # every loop sets its fetcher up right before iterating
        original(self, combined_loader)

    return setup


def trainer_check_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _check_config_and_set_final_flags(self: _AcceleratorConnector, strategy: Any, *args: Any, **kw: Any) -> None:
        theirs = getattr(type(strategy), "_lightning_package", None)  # set on PolicyStrategyMixin, per package
        if theirs is not None and theirs != _compat.PACKAGE:
            raise strategy_for_other_package(type(strategy), theirs, _compat.PACKAGE, "this Trainer")
        original(self, strategy, *args, **kw)

    return _check_config_and_set_final_flags


def hook_end_seam(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call_hook(trainer: Any, hook_name: str, *args: Any, **kwargs: Any) -> Any:
        output = original(trainer, hook_name, *args, **kwargs)
        seam_hooks.hook_ended()  # every rank calls the same hooks in the same order: the values logged in it sync
        return output

    return call_hook


def callback_hooks_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _call_callback_hooks(trainer: Any, hook_name: str, *args: Any, **kwargs: Any) -> None:
        own = getattr(getattr(trainer, "profiler", None), "__dict__", None)
        if own is None or not seam_hooks.coalescing():
            original(trainer, hook_name, *args, **kwargs)
        else:
            previous = own.get("profile", _ABSENT)
            own["profile"] = _CallbackBoundaries(trainer.profiler.profile, hook_name)
            try:
                original(trainer, hook_name, *args, **kwargs)
            finally:
                if previous is _ABSENT:
                    own.pop("profile", None)
                else:
                    own["profile"] = previous
        seam_hooks.hook_ended()  # the last callback's values

    return _call_callback_hooks


_ABSENT = object()


class _CallbackBoundaries:
    """``trainer.profiler.profile`` while Lightning calls every callback's ``hook_name``: the values a callback logged
    sync before the next callback's call.

    Lightning's loop (2.5 and 2.6) calls each callback inside ``trainer.profiler.profile("[Callback]<state_key>.<hook
    name>")``: for the loop's length that call first syncs what the callbacks before logged, and Lightning's own loop
    runs as it is (the patched loop calls ``callback_ended`` after each callback instead). A plain object, not a
    context manager and a closure: Lightning calls every callback hook several times a step.
    """

    __slots__ = ("profile", "suffix")

    def __init__(self, profile: Callable[[str], Any], hook_name: str) -> None:
        self.profile, self.suffix = profile, f".{hook_name}"

    def __call__(self, action_name: str) -> Any:
        if action_name.startswith("[Callback]") and action_name.endswith(self.suffix):
            seam_hooks.callback_ended()
        return self.profile(action_name)


def metrics_read_seam(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def metrics(self: Trainer) -> Any:
        return seam_hooks.metrics_read(original(self))  # while values are pending, their reads warn

    return metrics


def evaluation_batch_seam(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        seam_hooks.evaluation_batch_ended(self)  # a preemption stop, or another rank's error, ends the run here

    return step


def compiled_log_seam(original: Callable[..., None]) -> Callable[..., None]:
    """``LightningModule.log`` runs eagerly inside a ``torch.compile``'d module (Lightning #21837): dynamo cannot trace
    it (``InternalTorchDynamoError: AttributeError: 'method' object has no attribute '__dict__'``)."""
    return torch.compiler.disable(original)  # type: ignore[no-untyped-call,no-any-return]


def run_seam(original: Callable[..., Any]) -> Callable[..., Any]:
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
