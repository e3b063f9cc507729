"""One row of the decision record per applied decision, built on rank 0 and handed to the strategy's record file."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from lightning_ext._decisions.agreement import policy_label
from lightning_ext._decisions.reasons import StopState, TopKState, stop_reason, topk_reason
from lightning_ext._decisions.rows import Agreement
from lightning_ext.policies import AggregatePolicy, DecisionPolicy

__all__ = ["TopKBefore", "record", "recording", "stop_row", "top_k_before", "topk_row"]

Row = dict[str, Any]


def record(trainer: Any, build: Callable[[], Row]) -> None:
    """Hand the row that ``build`` makes to the strategy's record file, if this rank writes one (rank 0).

    The file calls ``build`` itself, so that an error while building a row, like one while writing it, makes the record
    step aside with a warning instead of ending the run. Other ranks do nothing.
    """
    sink = getattr(trainer.strategy, "decision_file", None)
    if sink is not None:
        sink.record(build)


def recording(trainer: Any) -> bool:
    """Whether this rank writes the record (so that the other ranks skip the work of a row)."""
    return getattr(trainer.strategy, "decision_file", None) is not None


@dataclass(frozen=True)
class TopKBefore:
    """A ``ModelCheckpoint``'s visible state before a decision was applied."""

    best_score: float | None
    best_path: str
    paths: tuple[str, ...]
    kth: float | None


def top_k_before(callback: ModelCheckpoint) -> TopKBefore:
    """The state :func:`topk_row` compares with (taken before ``_update_best_and_save``)."""
    full = callback.save_top_k > 0 and len(callback.best_k_models) >= callback.save_top_k
    kth = _number(callback.best_k_models.get(callback.kth_best_model_path)) if full else None
    return TopKBefore(_number(callback.best_model_score), callback.best_model_path, tuple(callback.best_k_models), kth)


def topk_row(
    callback: ModelCheckpoint,
    trainer: Any,
    policy: DecisionPolicy,
    agreement: Agreement,
    wanted: bool | None,
    saved: bool,
    score: float,
    before: TopKBefore,
) -> Row:
    """The row of a ``ModelCheckpoint`` decision, after the callback saved (or not)."""
    paths = tuple(callback.best_k_models)
    new = [path for path in paths if path not in before.paths]
    saved_as = (new[0] if len(new) == 1 else getattr(callback, "_last_checkpoint_saved", None)) if saved else None
    removed = [path for path in before.paths if path not in paths]
    state = TopKState(
        save_top_k=callback.save_top_k,
        mode=callback.mode,
        kept=len(before.paths),
        kth=before.kth,
        stock_rule=type(callback).check_monitor_top_k is ModelCheckpoint.check_monitor_top_k,
    )
    agreed = score if isinstance(policy, AggregatePolicy) else None  # in the metric's dtype, as it was decided
    reason = topk_reason(
        policy, agreement.ranks, state, saved_as=saved_as or None, score=score, agreed=agreed, wanted=wanted
    )
    return {
        **_common(callback, trainer, policy, agreement, "saved" if saved else "not saved", agreed),
        "saved_as": saved_as or None,
        "removed": removed[0] if removed else None,
        "best_before": before.best_score,
        "best_after": _number(callback.best_model_score),
        "best_path_before": before.best_path or None,
        "best_path_after": callback.best_model_path or None,
        "reason": reason,
    }


def stop_row(
    callback: EarlyStopping,
    trainer: Any,
    policy: DecisionPolicy,
    agreement: Agreement,
    stop: bool,
    wanted: bool,
    best_before: float | None,
    agreed: float | None,
) -> Row:
    """The row of an ``EarlyStopping`` decision, after every rank applied it (best scores are this rank's, rank 0's)."""
    state = StopState(
        mode=callback.mode,
        patience=callback.patience,
        min_delta=float(callback.min_delta),
        stopping_threshold=callback.stopping_threshold,
        divergence_threshold=callback.divergence_threshold,
        check_finite=callback.check_finite,
        stock_rule=type(callback)._evaluate_stopping_criteria is EarlyStopping._evaluate_stopping_criteria,
        best=best_before,
        wait=callback.wait_count,
    )
    reason = stop_reason(policy, agreement.ranks, state, stop=stop, wanted=wanted, agreed=agreed)
    return {
        **_common(callback, trainer, policy, agreement, "stop" if stop else "go on", agreed),
        "saved_as": None,
        "removed": None,
        "best_before": best_before,
        "best_after": _number(callback.best_score),
        "best_path_before": None,
        "best_path_after": None,
        "reason": reason,
    }


def _common(
    callback: Any, trainer: Any, policy: DecisionPolicy, agreement: Agreement, outcome: str, agreed: float | None
) -> Row:
    aggregate = isinstance(policy, AggregatePolicy)
    return {
        "step": int(trainer.global_step),
        "epoch": int(trainer.current_epoch),
        "callback": type(callback).__name__,
        "monitor": callback.monitor,
        "mode": callback.mode,
        "policy": policy_label(policy),
        "world_size": len(agreement.ranks),
        "outcome": outcome,
        "values": tuple(view.value for view in agreement.ranks),
        "votes": tuple(None if aggregate else view.vote for view in agreement.ranks),
        "yes": None if aggregate else agreement.yes,
        "agreed": agreed,
    }


def _number(value: Any) -> float | None:
    """A score (a tensor, or ``None``) as a float."""
    return None if value is None else float(value)
