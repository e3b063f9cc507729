"""Every logged metric's local (un-synced) value, captured beside the synced one Lightning logs."""

import sys
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.trainer.connectors.logger_connector import result as _result
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection, _ResultMetric
from torch import Tensor

from lightning_ext._files.storage import guarded

__all__ = [
    "OMITTED",
    "capture_active",
    "capture_error",
    "local_value",
    "local_values_for",
    "record_update",
    "start_capture",
    "stop_capture",
]

_LOCAL = "_lightning_ext_local"
_RECORDER = "_local_value_recorder"  # the module-level hook of a patched result.py
_STEP_VALUE, _BATCH_COUNT = 1, 2


class _Omitted:
    """The value exists on rank 0 only (``rank_zero_only=True``): this rank's file leaves the cell out."""

    def __repr__(self) -> str:
        return "OMITTED"


OMITTED = _Omitted()


@dataclass
class _Capture:
    active: bool = False
    rank: int = 0
    error: Exception | None = None


_CAPTURE = _Capture()


class _Local:
    """What this module keeps on one result metric (a plain class: ``apply_to_collection`` leaves it alone)."""

    __slots__ = ("count", "plan", "role", "step")

    def __init__(self, plan: int) -> None:
        self.plan = plan  # which of _STEP_VALUE / _BATCH_COUNT to record after each update
        self.step: Tensor | None = None  # the last step value, as logged, before its sync
        self.count: Tensor | None = None  # the batch-size count of a mean, before compute() syncs it in place
        self.role: _Role | None = None


class _Role:
    """How a result metric appears in logged rows: its key in step and epoch rows (``None``: not in them)."""

    __slots__ = ("epoch_key", "local_differs", "rank_zero_only", "step_key")

    def __init__(self, step_key: str | None, epoch_key: str | None, local_differs: bool, rank_zero_only: bool) -> None:
        self.step_key, self.epoch_key = step_key, epoch_key
        self.local_differs = local_differs  # the logged value is synced (or a Metric's own compute syncs)
        self.rank_zero_only = rank_zero_only


def start_capture(rank: int) -> None:
    """Record local values from now on (called on every rank by the strategy when per-rank metrics are on)."""
    _CAPTURE.active, _CAPTURE.rank, _CAPTURE.error = True, rank, None
    setattr(_result, _RECORDER, sys.modules[__name__])  # read by a patched Lightning (patches/ 0003)


def stop_capture() -> None:
    """Stop recording local values."""
    _CAPTURE.active = False
    setattr(_result, _RECORDER, None)


def capture_active() -> bool:
    """Whether local values are being recorded."""
    return _CAPTURE.active


def capture_error() -> Exception | None:
    """The error that switched capture off, if one did (since the last :func:`start_capture`)."""
    return _CAPTURE.error


def record_update(result_metric: _ResultMetric, value: Any) -> None:
    """After ``_ResultMetric.forward``: keep this rank's step value and batch count (the seam calls this).

    Only a synced value needs it: without a sync, Lightning's own step cache is a local copy, and nothing touches
    the batch count. Never raises: a failure switches capture off (see :func:`capture_error`).
    """
    if not _CAPTURE.active:
        return
    with guarded() as failure:  # a diagnostic must not end the training step
        local: _Local | None = result_metric.__dict__.get(_LOCAL)
        if local is None:
            local = result_metric.__dict__[_LOCAL] = _Local(_capture_plan(result_metric))
        plan = local.plan
        if plan & _STEP_VALUE and isinstance(value, Tensor):
            local.step = value.detach().clone()  # update() synced its own copy, not this one
        if plan & _BATCH_COUNT:
            local.count = result_metric.cumulated_batch_size.clone()
    if failure.error is not None:
        _CAPTURE.error = failure.error
        stop_capture()


def _capture_plan(result_metric: _ResultMetric) -> int:
    meta = result_metric.meta
    if not result_metric.is_tensor or not meta.sync.should or meta.sync.rank_zero_only:
        return 0
    plan = _STEP_VALUE if meta.on_step else 0
    if meta.is_mean_reduction and meta.on_epoch:
        plan |= _BATCH_COUNT
    return plan


def local_value(result_metric: _ResultMetric, on_step: bool) -> Tensor | None:
    """This rank's own value of a logged metric: the step value, or the epoch reduction over this rank's batches.

    Mean is weighted by batch size, as Lightning does; sum, min and max reduce this rank's values only.
    """
    kept: _Local | None = result_metric.__dict__.get(_LOCAL)
    if on_step:
        if kept is not None and kept.step is not None and result_metric.is_tensor:
            return kept.step
        # not synced: Lightning's step cache holds this rank's value; a Metric's forward() value is its own
        cache: Tensor | None = result_metric._forward_cache
        return cache
    if result_metric.is_tensor:
        value: Tensor = result_metric.value
        if result_metric.meta.is_mean_reduction:
            count = kept.count if kept is not None and kept.count is not None else result_metric.cumulated_batch_size
            return value / count
        return value
    return _local_metric_compute(result_metric.value)


def _local_metric_compute(metric: Any) -> Tensor | None:
    """``metric.compute()`` without syncing, leaving the metric's cached (synced) result as it was."""
    cached, to_sync = metric._computed, metric._to_sync
    metric._computed, metric._to_sync = None, False
    try:
        computed: Tensor = metric.compute()
    finally:
        metric._computed, metric._to_sync = cached, to_sync
    return computed if isinstance(computed, Tensor) else None


def local_values_for(results: _ResultCollection, on_step: bool, logged: dict[str, Any]) -> dict[str, Any]:
    """This rank's own value of each entry of a ``log`` dict about to be logged, where it differs, by key.

    ``logged`` was built by ``results.metrics(on_step)`` (possibly merged across dataloaders, as evaluation does), so
    each key is the forked name of one of ``results``' metrics: the same names are worked out here (once per result
    metric, then cached). Keys whose logged value is already this rank's own (not synced) are left out: the caller
    keeps the logged value. A ``rank_zero_only=True`` value on another rank maps to :data:`OMITTED`.
    """
    found: dict[str, Any] = {}
    for result_metric in results.values():
        local: _Local | None = result_metric.__dict__.get(_LOCAL)
        if local is None:
            local = result_metric.__dict__[_LOCAL] = _Local(_capture_plan(result_metric))
        role = local.role
        if role is None:
            role = local.role = _row_role(results, result_metric)
        key = role.step_key if on_step else role.epoch_key
        # the same selection as _ResultCollection.metrics / _get_cache
        if key is None or key not in logged or result_metric.has_reset:
            continue
        if role.rank_zero_only and _CAPTURE.rank != 0:
            found[key] = OMITTED
        elif role.local_differs:
            value = local_value(result_metric, on_step)
            if value is not None:
                found[key] = value
    return found


def _row_role(results: _ResultCollection, result_metric: _ResultMetric) -> _Role:
    meta = result_metric.meta
    step_key = results._forked_name(result_metric, True)[1] if meta.logger and meta.on_step else None
    epoch_key = results._forked_name(result_metric, False)[1] if meta.logger and meta.on_epoch else None
    synced = meta.sync.should and not meta.sync.rank_zero_only
    return _Role(step_key, epoch_key, synced or not result_metric.is_tensor, meta.sync.rank_zero_only)
