"""The hang checks' error messages: what differs between the ranks, where, and the fix; pure."""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lightning_ext import errors
from lightning_ext._hang.watchdog import Location

if TYPE_CHECKING:  # annotations only: lockstep imports this module
    from lightning_ext._hang.lockstep import Point

__all__ = ["FIXES", "count_text", "describe_deadlock", "describe_divergence", "error_class"]

FIXES = {
    "log": (
        "Every rank must make the same synced logging calls: move `self.log(..., sync_dist=True)` / `log_dict` out of"
        " any `if self.trainer.is_global_zero:` (or other rank-dependent) branch and log the same keys on every rank;"
        " to record a value that only rank 0 has, log it with `rank_zero_only=True` (it is not synced)."
    ),
    "collective": (
        "`trainer.log_dir`, `trainer.save_checkpoint(...)`, `self.all_gather(...)`, `strategy.barrier()` and"
        " `strategy.broadcast()` are collective: every rank must call them, in the same order. Call them outside"
        " `if trainer.is_global_zero:` and act on rank 0 only afterwards."
    ),
    "loaders": (
        "Give every rank the same number of batches (a DistributedSampler, `drop_last=True`, or shards split"
        " evenly), or pass `uneven_batches='truncate'` to the strategy to stop every rank's epoch at the shortest"
        " rank's count."
    ),
}
_FIX_OF_KIND: dict[str, str | None] = {
    "log": "log",
    "epoch_logs": "log",
    "collective": "collective",
    "loaders": "loaders",
    "batch": "loaders",
    "end": None,
}


def error_class(kinds: Sequence[str]) -> type[errors.CrossRankError]:
    """The error class for points of these kinds: uneven data if only batch counts differ, else the odd call out."""
    if all(kind in ("loaders", "batch") for kind in kinds):
        return errors.UnevenBatchesError
    if any(kind in ("log", "epoch_logs") for kind in kinds):
        return errors.DivergentLoggingError
    return errors.DivergentCollectiveError


def describe_divergence(points: Sequence["Point"]) -> errors.CrossRankError:
    """The error for ranks that reached different points at the same check."""
    cls = error_class([point.kind for point in points])
    if cls is errors.UnevenBatchesError and all(point.kind == "loaders" for point in points):
        headline, fix = _uneven_headline(points), "loaders"
    elif cls is errors.UnevenBatchesError:
        headline, fix = "The ranks ran different numbers of batches:", "loaders"
    elif cls is errors.DivergentLoggingError:
        headline, fix = _logging_headline(points), "log"
    else:
        headline, fix = (
            "The ranks reached different collective calls, so the job would hang or mix up values:",
            "collective",
        )
    lines = [headline, *(f"  rank {rank}: {point.where}" for rank, point in enumerate(points))]
    return cls("\n".join([*lines, FIXES[fix]]))


def describe_deadlock(point: "Point", rank: int, stuck: Sequence[Location]) -> errors.CrossRankError:
    """The error for a rank waiting at ``point`` that the ``stuck`` ranks will never reach."""
    cls = error_class([point.kind])
    ranks = sorted(location.rank for location in stuck)
    lines = [
        f"Rank {rank} is waiting at {point.where}, which rank(s) {ranks} never reached: they went on and are blocked"
        " in another collective call, so the job would hang until the process-group timeout.",
        f"  rank {rank}: {point.where}",
        *(f"  {location.describe()}" for location in sorted(stuck, key=lambda location: location.rank)),
        FIXES[_FIX_OF_KIND[point.kind] or "collective"],
    ]
    return cls("\n".join(lines))


def _uneven_headline(points: Sequence["Point"]) -> str:
    details: list[Any] = [point.detail for point in points]
    stage = details[0]["stage"]
    names = details[0]["names"]
    if any(detail["stage"] != stage or detail["names"] != names for detail in details):
        return "The ranks set up different dataloaders:"
    parts = []
    for position, name in enumerate(names):
        counts = [detail["counts"][position] for detail in details]
        if len(set(counts)) > 1:
            listed = ", ".join(f"rank {rank}: {count_text(count)}" for rank, count in enumerate(counts))
            parts.append(f"the {name} yields different numbers of batches per rank ({listed})")
    return f"Uneven data in {stage}: {'; '.join(parts)}. The ranks would run different numbers of steps and hang:"


def _logging_headline(points: Sequence["Point"]) -> str:
    if not any(point.kind == "log" for point in points):
        rounds = [point for point in points if point.kind == "epoch_logs"]
        first = min(point.position for point in rounds)
        return _epoch_keys_headline([point if point.position == first else None for point in points])
    logged = [point for point in points if point.kind == "log"]
    first = min(point.position for point in logged) if logged else 0
    culprits = {(p.detail["name"], p.detail["fx"], p.detail["site"]) for p in logged if p.position == first}
    parts = []
    for name, fx, site in sorted(culprits):
        having = [
            r for r, p in enumerate(points) if p.kind == "log" and p.position == first and p.detail["name"] == name
        ]
        others = [r for r in range(len(points)) if r not in having]
        parts.append(f"{name!r} ({fx}, {site}) is synced on rank(s) {having} but not on rank(s) {others}")
    return "Synced logging differs between ranks: " + "; ".join(parts) + ". The ranks would hang or mix up values:"


def _epoch_keys_headline(points: Sequence["Point | None"]) -> str:
    """The keys of the first epoch-end round that not every rank syncs (``None``: a rank that went on past it)."""
    keys_by_rank = [[] if p is None else [(entry["name"], entry["fx"]) for entry in _entries(p)] for p in points]
    sites = {(entry["name"], entry["fx"]): entry["site"] for p in points if p is not None for entry in _entries(p)}
    everyone = list(dict.fromkeys(key for keys in keys_by_rank for key in keys))
    parts = []
    for key in everyone:
        having = [rank for rank, keys in enumerate(keys_by_rank) if key in keys]
        lacking = [rank for rank, keys in enumerate(keys_by_rank) if key not in keys]
        if lacking:
            parts.append(f"{key[0]!r} ({sites[key]}) is synced on rank(s) {having} but not on rank(s) {lacking}")
    if not parts:
        parts.append("the same keys are synced in a different order on different ranks")
    return "Synced logging differs between ranks: " + "; ".join(parts) + ". The ranks would hang or mix up values:"


def _entries(point: "Point") -> list[dict[str, str]]:
    if point.kind == "log":
        return [point.detail]
    if point.kind == "epoch_logs":
        return list(point.detail)
    return []


def count_text(count: float) -> str:
    """A batch count for people: ``"no length"`` for a loader without one."""
    return "no length" if count == float("inf") else str(int(count))
