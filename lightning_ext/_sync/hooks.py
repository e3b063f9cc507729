"""What Lightning's seams call for the coalesced sync (a patched Lightning and the runtime wrappers alike)."""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Literal

from lightning_ext._collective import is_world
from lightning_ext._sync.pending import PendingMetrics, pending_names
from lightning_ext._sync.queue import SyncQueue

__all__ = [
    "LogSync",
    "active",
    "epoch_round",
    "hook_ended",
    "metrics_read",
    "start",
    "stop",
    "validate_log_sync",
    "value_syncing",
]

LogSync = Literal["coalesced", "per_value"]


def validate_log_sync(log_sync: Any) -> None:
    """Raise ``ValueError`` naming a bad ``log_sync`` option (at construction, before any collective)."""
    if log_sync not in ("coalesced", "per_value"):
        raise ValueError(
            f"log_sync must be 'coalesced' (the default: a hook's synced values sync together when it returns) or"
            f" 'per_value' (stock Lightning's sync inside each self.log), got {log_sync!r}"
        )


_ACTIVE: SyncQueue | None = None
_RANK, _WORLD_SIZE = 0, 1
_WARNED: set[Any] = set()  # the lines whose read of a pending value was warned about in this run
UNCOALESCED = nullcontext()  # reusable: what the context managers below are when nothing coalesces


def start(queue: SyncQueue, rank: int, world_size: int) -> None:
    """Coalesce from now on (the strategy calls this at set-up, on every rank)."""
    global _ACTIVE, _RANK, _WORLD_SIZE
    _ACTIVE, _RANK, _WORLD_SIZE = queue, rank, world_size
    _WARNED.clear()


def stop() -> None:
    """Stop coalescing (teardown); values still held are dropped with the run."""
    global _ACTIVE
    _ACTIVE = None


def active() -> SyncQueue | None:
    """The running queue, if any."""
    return _ACTIVE


def value_syncing(result_metric: Any, phase: str) -> AbstractContextManager[None]:
    """Around ``_ResultMetric.forward`` (``"step"``) or ``compute`` (``"epoch"``): the value that syncs inside."""
    queue = _ACTIVE
    if queue is None or not _coalesced(result_metric):
        return UNCOALESCED
    return queue.logging(result_metric, phase)


def hook_ended() -> None:
    """After each hook Lightning calls (``trainer/call.py``): sync the step values logged in it."""
    queue = _ACTIVE
    if queue is not None and queue.held:
        queue.flush()


def metrics_read(metrics: dict[str, Any]) -> dict[str, Any]:
    """``trainer.callback_metrics`` (``logged_metrics``, ``progress_bar_metrics``) as read now: while a hook's values
    are pending, a copy whose pending values warn when read (:class:`~lightning_ext._sync.pending.PendingMetrics`).

    No collective: the read may be under a rank guard. At world size 1 a value is already stock's.
    """
    queue = _ACTIVE
    if queue is None or not queue.held or _WORLD_SIZE == 1:
        return metrics
    pending = pending_names(queue.held)
    if not any(name in metrics for name in pending):
        return metrics
    return PendingMetrics(metrics, pending, _RANK, _WARNED)


def epoch_round(results: Any, on_step: bool) -> AbstractContextManager[None]:
    """Around ``_ResultCollection.metrics(on_step)``: the epoch values about to sync, synced together first."""
    queue = _ACTIVE
    if on_step or queue is None:
        return UNCOALESCED
    return _round(queue, results)


@contextmanager
def _round(queue: SyncQueue, results: Any) -> Iterator[None]:
    metrics = [metric for _, metric in results.valid_items() if _coalesced(metric) and _syncs_now(metric)]
    with queue.epoch_round(metrics):
        yield


def _coalesced(metric: Any) -> bool:
    """Whether a logged value syncs with the others: a tensor synced over every rank (not a torchmetrics metric, which
    syncs its own state in its ``compute()``, nor a value synced over another group)."""
    sync = metric.meta.sync
    return bool(metric.is_tensor and sync.should and not sync.rank_zero_only and is_world(sync.group))


def _syncs_now(metric: Any) -> bool:
    """Whether ``metrics(on_step=False)`` computes (and so syncs) this metric's epoch value now."""
    return bool(metric.meta.on_epoch and metric._computed is None)
