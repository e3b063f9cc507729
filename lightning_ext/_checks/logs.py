"""Checks on synced logging: the same keys, synced in the same order, on every rank, before Lightning syncs them."""

import functools
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from lightning_ext._checks.lockstep import Lockstep
from lightning_ext._checks.points import Point, collective_point
from lightning_ext._watch.sites import called_as
from lightning_ext._watch.sites import user_site as site_of

__all__ = [
    "LogChecks",
    "active",
    "batch_started",
    "check_pack",
    "check_reduce",
    "epoch_round",
    "start",
    "stop",
    "syncing",
    "user_site",
]

_STATE = "_lightning_ext_checks"
_PACKS_KEPT = 256  # distinct packs whose points are kept (a run has one per hook that logs synced values)
_UNKNOWN = "an unknown line"  # where a value was logged, when it was logged before the checks started


class _MetricState:
    """Where a logged metric was first logged, and its points: one plain object in the metric's ``__dict__``.

    Plain on purpose: Lightning walks a ``_ResultMetric``'s ``__dict__`` on every ``self.log`` (to move tensors) and
    leaves such objects alone; and the metric itself cannot be a dictionary key (torchmetrics hashes its state).
    """

    __slots__ = ("points", "site")

    def __init__(self, site: str) -> None:
        self.site = site
        self.points: dict[tuple[str, int], Point] = {}


def _state(metric: Any) -> _MetricState | None:
    state: _MetricState | None = metric.__dict__.get(_STATE)
    return state


@dataclass
class LogChecks:
    """The logging checks of the running strategy, and what is syncing right now."""

    lockstep: Lockstep
    trainer: Any = None
    metric: Any = None  # the _ResultMetric whose value is syncing
    phase: str = ""  # "step" or "epoch"
    part: int = 0  # the how-many-th sync of this metric in this phase (a mean syncs its sum, then its count)
    covered: bool = False  # an epoch round's check already covered the per-key syncs
    # each hook's pack of step values, checked every step: its point, built once (keyed by the metrics' ids, which
    # the kept list of the metrics themselves holds on to, so that no id is reused while its entry lives)
    packs: dict[tuple[Any, ...], tuple[list[Any], Point]] = field(default_factory=dict)


_ACTIVE: LogChecks | None = None


def start(lockstep: Lockstep, trainer: Any) -> None:
    """Check synced logging from now on (the strategy calls this at set-up, on every rank)."""
    global _ACTIVE
    _ACTIVE = LogChecks(lockstep, trainer)


def stop() -> None:
    """Stop checking."""
    global _ACTIVE
    _ACTIVE = None


def active() -> LogChecks | None:
    """The running checks, if any."""
    return _ACTIVE


def batch_started() -> None:
    """A train or evaluation batch starts (the logger connector's ``on_batch_start`` seam)."""
    checks = _ACTIVE
    if checks is not None:  # a step value's sync must happen at the same batch (of every stage) on every rank
        checks.lockstep.recorder.batches += 1


@contextmanager
def syncing(metric: Any, phase: str) -> Iterator[None]:
    """Within the block, ``strategy.reduce`` calls sync ``metric``'s ``phase`` value (set by the seams)."""
    checks = _ACTIVE
    if checks is None:
        yield
        return
    if phase == "step" and _STATE not in metric.__dict__:
        metric.__dict__[_STATE] = _MetricState(user_site())
    previous = checks.metric, checks.phase, checks.part
    checks.metric, checks.phase, checks.part = metric, phase, 0
    try:
        yield
    finally:
        checks.metric, checks.phase, checks.part = previous


@contextmanager
def epoch_round(results: Any) -> Iterator[None]:
    """Before ``results.metrics(on_step=False)``: check the epoch keys about to sync, then let them sync unchecked."""
    checks = _ACTIVE
    if checks is None or checks.covered:
        yield
        return
    entries = [_entry(metric) for metric in _pending_epoch_syncs(results)]
    if entries:
        keys = tuple((entry["fx"], entry["name"], entry["dataloader"], entry["reduce"]) for entry in entries)
        names = ", ".join(repr(entry["name"]) for entry in entries)
        stage, position = _round(checks, results)
        where = f"the {stage} epoch-end sync of {names}"
        point = Point("epoch_logs", ("epoch_logs", keys), where, entries)
        checks.lockstep.require(point, position, f"epoch {checks.trainer.current_epoch}")
    checks.covered = bool(entries)
    try:
        yield
    finally:
        checks.covered = False


def check_reduce(checks: LogChecks, tensor: Any, reduce_op: Any) -> None:
    """Check one ``strategy.reduce`` call: a logged value's sync (at its batch or epoch round), or another reduce."""
    metric = checks.metric
    if metric is None:
        identity = ("reduce", str(reduce_op), str(tensor.dtype), tuple(tensor.shape))
        call = f"strategy.reduce(..., reduce_op={reduce_op!r})"
        checks.lockstep.require(collective_point(call, identity, called_as(sys._getframe(1))))
        return
    if checks.covered and checks.phase == "epoch":
        return
    point = _log_point(checks, metric)
    if checks.phase == "step":
        checks.lockstep.require(point, checks.lockstep.recorder.batches, functools.partial(batch_label, checks.trainer))
    else:  # an epoch value computed outside an epoch round
        checks.lockstep.require(point, -_round(checks, None)[1], f"epoch {checks.trainer.current_epoch}")


def check_pack(checks: LogChecks, metrics: Sequence[Any], layout: tuple[Any, ...]) -> None:
    """Check the step values that a hook logged, about to sync together: the same keys, synced in the same order, at
    the same batch, packed alike (``layout``: each pack's op, dtype, size, device), on every rank (the coalesced sync's
    one check per hook)."""
    cache = checks.packs
    key = (*map(id, metrics), layout)
    found = cache.get(key)
    if found is None:
        if len(cache) >= _PACKS_KEPT:
            cache.clear()
        found = cache[key] = (list(metrics), _pack_point(metrics, layout))
    label = functools.partial(batch_label, checks.trainer)
    checks.lockstep.require(found[1], checks.lockstep.recorder.batches, label)


def _pack_point(metrics: Sequence[Any], layout: tuple[Any, ...]) -> Point:
    entries = [_entry(metric) for metric in metrics]
    keys = tuple((entry["fx"], entry["name"], entry["dataloader"], entry["reduce"]) for entry in entries)
    names = ", ".join(repr(entry["name"]) for entry in entries)
    where = f"the step sync of {names} logged in {entries[0]['fx']}"
    identity = ("step_logs", keys, layout)  # packs of another dtype would meet in one all-reduce
    return Point("step_logs", identity, where, entries, call=entries[0]["call"], site=entries[0]["site"])


def batch_label(trainer: Any) -> str:
    """``batch_idx 3 of training epoch 0``: the batch a step value is logged at, as the user's hooks number it."""
    try:
        if trainer.training:
            return f"batch_idx {trainer.fit_loop.epoch_loop.batch_idx} of training epoch {trainer.current_epoch}"
        loop = trainer._evaluation_loop
        stage = "the sanity check" if trainer.sanity_checking else "testing" if trainer.testing else "validation"
        return f"batch_idx {loop.batch_progress.current.ready - 1} of {stage} (epoch {trainer.current_epoch})"
    except (AttributeError, TypeError):  # a trainer without those loops (half set up): a label for people, no error
        return "this batch"


def _log_point(checks: LogChecks, metric: Any) -> Point:
    part, checks.part = checks.part, checks.part + 1
    state = _state(metric)
    if state is None:
        state = metric.__dict__[_STATE] = _MetricState(_UNKNOWN)
    cache = state.points
    point = cache.get((checks.phase, part))
    if point is None:
        entry = _entry(metric)
        key = ("log", checks.phase, entry["fx"], entry["name"], entry["dataloader"], part)
        site = None if state.site == _UNKNOWN else state.site
        point = Point("log", key, _describe(entry, checks.phase), entry, call=entry["call"], site=site)
        cache[(checks.phase, part)] = point
    return point


def user_site() -> str:
    """``file:line in function`` of the innermost caller outside torch, Lightning, lightning-ext and the stdlib."""
    return str(site_of(sys._getframe(1)))


def _round(checks: LogChecks, results: Any) -> tuple[str, int]:
    """Which epoch-end round this is, for people and as a position that orders the rounds of a fit."""
    trainer = checks.trainer
    if trainer.sanity_checking:
        stage, order = "sanity check", 0
    elif (results is not None and results.training) or (results is None and trainer.training):
        stage, order = "training", 2
    else:
        stage, order = "validation" if not trainer.testing else "test", 1
    return stage, 1 + 4 * trainer.current_epoch + order


def _pending_epoch_syncs(results: Any) -> list[Any]:
    """The logged metrics whose epoch value will sync when computed now, in Lightning's order."""
    pending = []
    for _, metric in results.valid_items():
        meta = metric.meta
        if not meta.on_epoch or metric._computed is not None:
            continue
        if metric.is_tensor:
            if meta.sync.should and not meta.sync.rank_zero_only:
                pending.append(metric)
        elif getattr(metric.value, "sync_on_compute", True) and getattr(metric.value, "_to_sync", True):
            pending.append(metric)  # a torchmetrics metric syncs its state in its own compute()
    return pending


def _entry(metric: Any) -> dict[str, Any]:
    """A synced key, for the checks and their messages: its name, hook, reduction, call and the user's line."""
    meta = metric.meta
    state = _state(metric)
    call = f"self.log({meta.name!r}, sync_dist=True)" if metric.is_tensor else f"self.log({meta.name!r}, <metric>)"
    return {
        "name": meta.name,
        "fx": meta.fx,
        "dataloader": meta.dataloader_idx,
        "reduce": "metric" if not metric.is_tensor else getattr(meta.reduce_fx, "__name__", str(meta.reduce_fx)),
        "site": _UNKNOWN if state is None else state.site,
        "call": call,
    }


def _describe(entry: dict[str, Any], phase: str) -> str:
    return f"{entry['call']} ({phase} value) in {entry['fx']}, {entry['site']}"
