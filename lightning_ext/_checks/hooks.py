"""What the hang checks' seams in Lightning call: a patched Lightning and the runtime wrappers alike."""

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from lightning_ext._checks import guard, loaders, logs

__all__ = [
    "after_eval_setup_data",
    "after_fit_setup_data",
    "batch_started",
    "epoch_round",
    "evaluation_batch_ended",
    "fetch",
    "max_batches",
    "syncing",
]

UNCHECKED = nullcontext()  # reusable: what the context managers below are when no checks run


def syncing(result_metric: Any, phase: str) -> AbstractContextManager[None]:
    """Around ``_ResultMetric.forward`` (``"step"``) or ``compute`` (``"epoch"``): the value that syncs inside."""
    if logs.active() is None:
        return UNCHECKED
    return logs.syncing(result_metric, phase)


def epoch_round(results: Any, on_step: bool) -> AbstractContextManager[None]:
    """Around ``_ResultCollection.metrics(on_step)``: before the epoch values sync, check the keys on every rank."""
    if on_step or logs.active() is None:
        return UNCHECKED
    return logs.epoch_round(results)


def batch_started() -> None:
    """After ``_LoggerConnector.on_batch_start``: a batch starts (step syncs are checked at their batch)."""
    logs.batch_started()


def after_fit_setup_data(loop: Any) -> None:
    """After ``_FitLoop.setup_data``: compare the training batch counts."""
    checks = loaders.active()
    if checks is not None:
        checks.after_fit_setup_data(loop)


def after_eval_setup_data(loop: Any) -> None:
    """After ``_EvaluationLoop.setup_data``: compare the evaluation batch counts."""
    checks = loaders.active()
    if checks is not None:
        checks.after_eval_setup_data(loop)


def max_batches(loop: Any, counts: list[Any]) -> list[Any]:
    """``_EvaluationLoop.max_batches``: the stock counts, cut to the agreed ones where ``uneven_batches="truncate"``."""
    return loaders.truncated_max_batches(loop, counts)


def fetch(fetcher: Any, next_batch: Callable[[], Any]) -> Any:
    """``_PrefetchDataFetcher.__next__`` (``next_batch`` is the stock body): unsized loaders agree after each fetch."""
    checks = loaders.active()
    if checks is None or not checks.unsized:
        return next_batch()
    try:
        batch = next_batch()
    except StopIteration:
        checks.after_fetch(fetcher, exhausted=True, dataloader_index=None)
        raise
    index = batch[2] if isinstance(batch, tuple) and len(batch) == 3 else None
    if checks.after_fetch(fetcher, exhausted=False, dataloader_index=index):
        raise StopIteration
    return batch


def evaluation_batch_ended(loop: Any) -> None:
    """After each ``_EvaluationLoop._evaluation_step`` and ``_PredictionLoop._predict_step``: another rank's error, or
    an agreed preemption stop in a fit, ends this rank here."""
    running = guard.active()
    if running is not None:
        running.evaluation_batch_ended(loop)
