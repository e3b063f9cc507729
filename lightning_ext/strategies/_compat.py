"""The Lightning releases lightning-ext is verified with, and the private Lightning methods it wraps or calls.

Compiled once per Lightning package (``lightning``, ``pytorch_lightning``), it checks the package it imports.
"""

import inspect
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import lightning
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
from lightning.pytorch.loops.fetchers import _DataFetcher, _PrefetchDataFetcher
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.prediction_loop import _PredictionLoop
from lightning.pytorch.trainer import call as _call
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection, _ResultMetric
from lightning.pytorch.utilities import rank_zero_warn

from lightning_ext._packages.choice import DISTRIBUTIONS, Package

__all__ = [
    "CALLED",
    "PACKAGE",
    "SIGNATURES",
    "VERIFIED",
    "check_signatures",
    "lightning_version",
    "warn_if_unverified",
]

VERIFIED = ("2.5.6", "2.6.6")
"""The Lightning releases the test suite and the patch series are verified against (one per supported minor line)."""

PACKAGE: Package = "pytorch_lightning" if lightning.__name__ == "pytorch_lightning" else "lightning"
"""The Lightning package this module was compiled for: ``import lightning`` is ``pytorch_lightning`` in its mirror."""

_NAME = "Lightning" if PACKAGE == "lightning" else "pytorch_lightning"
_PIP = f"pip install '{DISTRIBUTIONS[PACKAGE]}=={VERIFIED[-1]}'"

_WARNED: list[str] = []  # the version warned about, once per process


def lightning_version() -> str:
    """The installed version of :data:`PACKAGE` (``lightning.__version__``, read at each call).

    Example:
        >>> lightning_version().startswith("2.")
        True

    """
    return str(lightning.__version__)


def warn_if_unverified() -> None:
    """Warn once per process (on rank 0) when the installed Lightning is not one of :data:`VERIFIED`."""
    version = lightning_version()
    if version in VERIFIED or version in _WARNED:
        return
    _WARNED.append(version)
    rank_zero_warn(
        f"lightning-ext is verified with Lightning {' and '.join(VERIFIED)}; the installed {_NAME} is {version}."
        " It reaches into some private Lightning methods and checks their signatures before it wraps them, but"
        f" behaviour on other releases is not tested. Install a verified release (e.g. `{_PIP}`) if anything"
        " misbehaves.",
        category=UserWarning,
    )


SIGNATURES: dict[tuple[Any, str], tuple[tuple[str, ...], ...]] = {
    # wrapped at run time (lightning_ext.strategies._runtime)
    (ModelCheckpoint, "_save_topk_checkpoint"): (("self", "trainer", "monitor_candidates"),),
    (ModelCheckpoint, "on_train_batch_end"): (("self", "trainer", "pl_module", "outputs", "batch", "batch_idx"),),
    (EarlyStopping, "_run_early_stopping_check"): (("self", "trainer"),),
    (_LoggerConnector, "log_metrics"): (("self", "metrics", "step"),),
    (_ResultMetric, "forward"): (("self", "value", "batch_size"),),
    (_ResultMetric, "compute"): (("self",),),
    (_LoggerConnector, "on_batch_start"): (("self", "batch", "dataloader_idx"),),
    (_ResultCollection, "metrics"): (("self", "on_step"),),
    (_FitLoop, "setup_data"): (("self",),),
    (_EvaluationLoop, "setup_data"): (("self",),),
    (_EvaluationLoop, "max_batches"): (("self",),),  # a property: its getter
    (_PrefetchDataFetcher, "__next__"): (("self",),),
    (Trainer, "_run"): (("self", "model", "ckpt_path"), ("self", "model", "ckpt_path", "weights_only")),  # 2.5, 2.6
    (_DataFetcher, "setup"): (("self", "combined_loader"),),
    # each evaluation and prediction batch's end (a preemption stop, another rank's error), the trainer's metrics
    (_EvaluationLoop, "_evaluation_step"): (("self", "batch", "batch_idx", "dataloader_idx", "dataloader_iter"),),
    (_PredictionLoop, "_predict_step"): (("self", "batch", "batch_idx", "dataloader_idx", "dataloader_iter"),),
    (Trainer, "callback_metrics"): (("self",),),  # properties: their getters
    (Trainer, "logged_metrics"): (("self",),),
    (Trainer, "progress_bar_metrics"): (("self",),),
    # trainer/call.py's functions (the hooks end there: the coalesced sync), and the log a compiled module calls
    (_call, "_call_lightning_module_hook"): (("trainer", "hook_name", "args", "pl_module", "kwargs"),),
    (_call, "_call_callback_hooks"): (("trainer", "hook_name", "args", "monitoring_callbacks", "kwargs"),),
    (_call, "_call_strategy_hook"): (("trainer", "hook_name", "args", "kwargs"),),
    (LightningModule, "log"): (
        (
            *("self", "name", "value", "prog_bar", "logger", "on_step", "on_epoch", "reduce_fx", "enable_graph"),
            *("sync_dist", "sync_dist_group", "add_dataloader_idx", "batch_size", "metric_attribute", "rank_zero_only"),
        ),
    ),
    # wrapped once the package is imported: its Trainer names our strategy of the other package (_runtime)
    (_AcceleratorConnector, "_check_config_and_set_final_flags"): (
        ("self", "strategy", "accelerator", "precision", "plugins", "sync_batchnorm"),
    ),
    # called (lightning_ext._decisions.checkpoint, lightning_ext._per_rank.local_values), on a patched Lightning too
    (ModelCheckpoint, "_monitor_candidates"): (("self", "trainer"),),
    (ModelCheckpoint, "check_monitor_top_k"): (("self", "trainer", "current"),),
    (ModelCheckpoint, "_update_best_and_save"): (("self", "current", "trainer", "monitor_candidates"),),
    (EarlyStopping, "_evaluate_stopping_criteria"): (("self", "current"),),
    (EarlyStopping, "_log_info"): (("trainer", "message", "log_rank_zero_only"),),  # a staticmethod
    (_ResultCollection, "_forked_name"): (("self", "result_metric", "on_step"),),
}
"""``(class, method name)`` → the parameter names it may have, one tuple per verified form."""

CALLED: tuple[tuple[Any, str], ...] = tuple(list(SIGNATURES)[-6:])
"""The methods lightning-ext calls without wrapping them: checked whether or not Lightning is patched."""


def check_signatures(methods: Iterable[tuple[Any, str]]) -> None:
    """Raise if one of ``methods`` has other parameters than :data:`SIGNATURES` records.

    Example:
        >>> check_signatures([(EarlyStopping, "_run_early_stopping_check")])  # as on every verified Lightning

    Raises:
        RuntimeError: naming the method, the expected and the found parameters, and the Lightning version.

    """
    for owner, name in methods:
        accepted = SIGNATURES[(owner, name)]
        found = _parameters(owner, name)
        if found in accepted:
            continue
        version = lightning_version()
        raise RuntimeError(
            f"lightning-ext cannot use {_dotted(owner)}.{name} of {_NAME} {version}: it"
            f" expects the parameters {' or '.join(_format(names) for names in accepted)}, found"
            f" {'no such method' if found is None else _format(found)}. lightning-ext is verified with Lightning"
            f" {' and '.join(VERIFIED)}: install one of them (e.g. `{_PIP}`), or a lightning-ext release that"
            f" supports {_NAME} {version}."
        )


def _dotted(owner: Any) -> str:
    """``lightning.pytorch.trainer.call`` for a module, ``module.Class`` for a class."""
    return owner.__name__ if isinstance(owner, ModuleType) else f"{owner.__module__}.{owner.__qualname__}"


def _parameters(owner: Any, name: str) -> tuple[str, ...] | None:
    """The parameter names of ``owner.name`` (a property's getter), or ``None`` if there is no such callable."""
    attribute = inspect.getattr_static(owner, name, None)
    function = attribute.fget if isinstance(attribute, property) else getattr(owner, name, None)
    if not callable(function):
        return None
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # a builtin without a readable signature
        return ("...",)


def _format(names: tuple[str, ...]) -> str:
    return f"({', '.join(names)})"
