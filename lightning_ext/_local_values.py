"""Every logged metric's local (un-synced) value, captured beside the synced one Lightning logs.

Lightning keeps a logged value in a ``_ResultMetric``. The epoch sum is accumulated locally and synced inside
``compute()`` on a copy, so it stays local. Two things do not: the step value is synced inside ``update()``, and the
batch-size count of a mean is synced *in place* by ``compute()``. So after every ``update()`` this module records
the step value as logged and a copy of the count (:func:`record_update`). A ``torchmetrics.Metric`` is computed
locally with its ``_computed`` cache set aside and restored, so the synced value that rank 0 logs and callbacks
monitor is untouched.

When a row is about to be logged, :func:`local_values_for` pairs each of its keys with the result metric it came
from, by the same forked names Lightning builds, and reads that metric's local value. Nothing here communicates.

Capture is off unless a strategy turned it on with :func:`start_capture`, so stock runs pay one flag check per
``self.log`` call.
"""

import sys
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.trainer.connectors.logger_connector import result as _result
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection, _ResultMetric
from torch import Tensor

__all__ = [
    "OMITTED",
    "capture_active",
    "local_value",
    "local_values_for",
    "record_update",
    "start_capture",
    "stop_capture",
]

_LOCAL_STEP = "_lightning_ext_local_step"
_LOCAL_COUNT = "_lightning_ext_local_batch_count"
_RECORDER = "_local_value_recorder"  # the module-level hook of a patched result.py


class _Omitted:
    """The value exists on rank 0 only (``rank_zero_only=True``): this rank's file leaves the cell out."""

    def __repr__(self) -> str:
        return "OMITTED"


OMITTED = _Omitted()


@dataclass
class _Capture:
    active: bool = False
    rank: int = 0


_CAPTURE = _Capture()


def start_capture(rank: int) -> None:
    """Record local values from now on (called on every rank by the strategy when per-rank metrics are on)."""
    _CAPTURE.active, _CAPTURE.rank = True, rank
    setattr(_result, _RECORDER, sys.modules[__name__])  # read by a patched Lightning (patches/ 0003)


def stop_capture() -> None:
    """Stop recording local values."""
    _CAPTURE.active = False
    setattr(_result, _RECORDER, None)


def capture_active() -> bool:
    """Whether local values are being recorded."""
    return _CAPTURE.active


def record_update(result_metric: _ResultMetric, value: Any) -> None:
    """After ``_ResultMetric.forward``: keep this rank's step value and batch count (the seam calls this).

    Only a synced value needs it: without a sync, Lightning's own step cache is a local copy, and nothing touches
    the batch count.
    """
    if not (_CAPTURE.active and result_metric.is_tensor and isinstance(value, Tensor)):
        return
    meta = result_metric.meta
    if not meta.sync.should or meta.sync.rank_zero_only:
        return
    if meta.on_step:
        result_metric.__dict__[_LOCAL_STEP] = value.detach().clone()  # update() synced its own copy, not this one
    if meta.is_mean_reduction and meta.on_epoch:
        result_metric.__dict__[_LOCAL_COUNT] = result_metric.cumulated_batch_size.clone()


def local_value(result_metric: _ResultMetric, on_step: bool) -> Tensor | None:
    """This rank's own value of a logged metric: the step value, or the epoch reduction over this rank's batches.

    Mean is weighted by batch size, as Lightning does; sum, min and max reduce this rank's values only.
    """
    if on_step:
        local: Tensor | None = result_metric.__dict__.get(_LOCAL_STEP)
        if local is not None and result_metric.is_tensor:
            return local
        # not synced: Lightning's step cache holds this rank's value; a Metric's forward() value is its own
        cache: Tensor | None = result_metric._forward_cache
        return cache
    if result_metric.is_tensor:
        value: Tensor = result_metric.value
        if result_metric.meta.is_mean_reduction:
            count: Tensor = result_metric.__dict__.get(_LOCAL_COUNT, result_metric.cumulated_batch_size)
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
    """This rank's own value of each entry of a ``log`` dict about to be logged, by key.

    ``logged`` was built by ``results.metrics(on_step)`` (possibly merged across dataloaders, as evaluation does), so
    each key is the forked name of one of ``results``' metrics: the same names are recomputed here, once per logged
    row. A ``rank_zero_only=True`` value on another rank maps to :data:`OMITTED`.
    """
    found: dict[str, Any] = {}
    for result_metric in results.values():
        meta = result_metric.meta
        if result_metric.has_reset or not meta.logger or not (meta.on_step if on_step else meta.on_epoch):
            continue  # the same selection as _ResultCollection.metrics / _get_cache
        _, forked_name = results._forked_name(result_metric, on_step)
        if forked_name not in logged:
            continue
        if meta.sync.rank_zero_only and _CAPTURE.rank != 0:
            found[forked_name] = OMITTED
        else:
            local = local_value(result_metric, on_step)
            if local is not None:
                found[forked_name] = local
    return found
