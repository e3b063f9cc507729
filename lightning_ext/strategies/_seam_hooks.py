"""What Lightning's seams call, patched or wrapped alike: the hang checks' hooks and the coalesced sync's, composed.

A patched Lightning reaches this module through its ``_lightning_ext_hooks`` attributes (set by ``_runtime.install``);
the runtime wrappers call it too. Each hook is a no-op while no lightning-ext strategy runs.
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from lightning_ext._checks import hooks as hang
from lightning_ext._sync import hooks as sync

__all__ = [
    "after_eval_setup_data",
    "after_fit_setup_data",
    "batch_started",
    "callback_ended",
    "coalescing",
    "epoch_round",
    "evaluation_batch_ended",
    "fetch",
    "hook_ended",
    "max_batches",
    "metrics_read",
    "syncing",
]

after_eval_setup_data = hang.after_eval_setup_data
after_fit_setup_data = hang.after_fit_setup_data
batch_started = hang.batch_started
evaluation_batch_ended = hang.evaluation_batch_ended
fetch = hang.fetch
max_batches = hang.max_batches
hook_ended = sync.hook_ended
callback_ended = sync.hook_ended  # after each callback's call of a hook: the values it logged sync before the next runs
metrics_read = sync.metrics_read


def coalescing() -> bool:
    """Whether a lightning-ext strategy coalesces synced values now (a callback's values then sync after its call)."""
    return sync.active() is not None


def syncing(result_metric: Any, phase: str) -> AbstractContextManager[None]:
    """Around ``_ResultMetric.forward`` (``"step"``) or ``compute`` (``"epoch"``): the value that syncs inside.

    Nothing, for a tensor value that Lightning does not sync (most logged values: its ``meta.sync`` is a no-op); a
    torchmetrics metric syncs its own state, and the checks keep the line it was logged at for their messages.
    """
    how = result_metric.meta.sync
    if result_metric.is_tensor and (not how.should or how.rank_zero_only):
        return hang.UNCHECKED
    return _both(hang.syncing(result_metric, phase), sync.value_syncing(result_metric, phase))


def epoch_round(results: Any, on_step: bool) -> AbstractContextManager[None]:
    """Around ``_ResultCollection.metrics(on_step)``: the epoch round's keys checked, then its values synced."""
    return _both(hang.epoch_round(results, on_step), sync.epoch_round(results, on_step))


def _both(first: AbstractContextManager[None], second: AbstractContextManager[None]) -> AbstractContextManager[None]:
    if first is hang.UNCHECKED:
        return second
    if second is sync.UNCOALESCED:
        return first
    return _nested(first, second)


@contextmanager
def _nested(first: AbstractContextManager[None], second: AbstractContextManager[None]) -> Iterator[None]:
    with first, second:
        yield
