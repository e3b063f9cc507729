"""Every logged metric's local (un-synced) value, captured beside the synced one Lightning logs.

Lightning keeps a logged value in a ``_ResultMetric``. The epoch sum is accumulated locally and synced inside
``compute()`` on a copy, so it stays local. Two things do not: the step value is synced inside ``update()``, and the
batch-size count of a mean is synced *in place* by ``compute()``. So after every ``update()`` this module records
the step value as logged and a copy of the count (:func:`record_update`). A ``torchmetrics.Metric`` is computed
locally with its ``_computed`` cache set aside and restored, so the synced value that rank 0 logs and callbacks
monitor is untouched.

When ``_ResultCollection.metrics()`` builds the ``log`` dict, each synced tensor put in it gets its local counterpart
as an attribute (:func:`local_of`). The attribute travels with the tensor through Lightning's merging of dicts, down
to ``_LoggerConnector.log_metrics``. Nothing here communicates.

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
    "local_of",
    "local_value",
    "record_log_dict",
    "record_update",
    "start_capture",
    "stop_capture",
]

_LOCAL_STEP = "_lightning_ext_local_step"
_LOCAL_COUNT = "_lightning_ext_local_batch_count"
_LOCAL_OF = "_lightning_ext_local"
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
    """After ``_ResultMetric.forward``: keep this rank's step value and batch count (the seam calls this)."""
    if not (_CAPTURE.active and result_metric.is_tensor and isinstance(value, Tensor)):
        return
    if result_metric.meta.on_step:
        result_metric.__dict__[_LOCAL_STEP] = value.detach().clone()  # update() synced its own copy, not this one
    if result_metric.meta.is_mean_reduction and result_metric.meta.on_epoch:
        result_metric.__dict__[_LOCAL_COUNT] = result_metric.cumulated_batch_size.clone()


def local_value(result_metric: _ResultMetric, on_step: bool) -> Tensor | None:
    """This rank's own value of a logged metric: the step value, or the epoch reduction over this rank's batches.

    Mean is weighted by batch size, as Lightning does; sum, min and max reduce this rank's values only.
    """
    if on_step:
        if result_metric.is_tensor:
            local: Tensor | None = result_metric.__dict__.get(_LOCAL_STEP)
            return local
        cache: Tensor | None = result_metric._forward_cache  # the metric's own forward() value on this rank
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


def record_log_dict(results: _ResultCollection, on_step: bool, log: dict[str, Tensor]) -> None:
    """Attach to each synced tensor of a freshly built ``log`` dict its local value (the metrics seam calls this)."""
    if not _CAPTURE.active:
        return
    for _, result_metric in results.valid_items():
        if not result_metric.meta.logger:
            continue
        _, forked_name = results._forked_name(result_metric, on_step)
        synced = log.get(forked_name)
        if synced is None:
            continue
        local: Tensor | _Omitted | None
        if result_metric.meta.sync.rank_zero_only and _CAPTURE.rank != 0:
            local = OMITTED
        else:
            local = local_value(result_metric, on_step)
        if local is not None:
            setattr(synced, _LOCAL_OF, local)


def local_of(value: Any) -> Tensor | _Omitted | None:
    """The local counterpart attached to a synced tensor of a ``log`` dict, if any."""
    found: Tensor | _Omitted | None = getattr(value, _LOCAL_OF, None) if isinstance(value, Tensor) else None
    return found
