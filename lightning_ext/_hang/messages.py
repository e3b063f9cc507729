"""The hang checks' error messages: the true cause, where it is, and a fix that works; pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lightning_ext import errors
from lightning_ext._hang.facts import Call, Facts
from lightning_ext._hang.progress import Progress

if TYPE_CHECKING:
    from lightning_ext._hang.lockstep import Point

__all__ = ["FIXES", "describe_deadlock", "describe_divergence", "signalled_message"]

FIXES = {
    "log": (
        "Every rank must make the same synced logging calls: move `self.log(..., sync_dist=True)` / `log_dict` out of"
        " any `if self.trainer.is_global_zero:` (or other rank-dependent) branch and log the same keys on every rank;"
        " to record a value that only rank 0 has, log it with `rank_zero_only=True` (it is not synced)."
    ),
    "metric": (
        "A logged torchmetrics metric syncs its state across the ranks when it is computed, so every rank must update"
        " and log the metric object: drop the rank-dependent branch around `metric.update(...)` / `self.log(...,"
        " metric)` (ranks without data of their own can skip `update`, but not the `self.log`). `rank_zero_only=True`"
        " does not stop a metric object from syncing; to record a value of rank 0 alone, log a plain tensor with"
        " `rank_zero_only=True`."
    ),
    "collective": (
        "`trainer.log_dir`, `trainer.save_checkpoint(...)`, `self.all_gather(...)`, `strategy.barrier()`,"
        " `strategy.broadcast()` and every `torch.distributed` collective are collective: every rank must call them,"
        " in the same order. Call them outside `if trainer.is_global_zero:` and act on rank 0 only afterwards."
    ),
    "loaders": (
        "Give every rank the same number of batches (a DistributedSampler, `drop_last=True`, or shards split"
        " evenly), or pass `uneven_batches='truncate'` to the strategy to stop every rank's epoch at the shortest"
        " rank's count."
    ),
    "streams": (
        "Give every rank's stream the same number of batches, or pass `check_unsized_loaders=True` to the strategy to"
        " compare the ranks batch by batch (with `uneven_batches='truncate'`, every rank then stops where the first"
        " one runs out)."
    ),
    "signal": (
        "A signal to one rank alone cannot stop a DDP job cleanly: send it to every rank's process at once (the whole"
        " process group of the launcher, `scancel --signal=TERM` on SLURM; torchrun forwards SIGTERM to every worker)."
    ),
}
_FIX_OF_KIND = {
    "log": "log",
    "epoch_logs": "log",
    "step_logs": "log",
    "collective": "collective",
    "loaders": "loaders",
    "batch": "loaders",
}
_LOGS = ("log", "epoch_logs", "step_logs")  # the kinds of point where synced logging is checked
_SIGNAL_CAUSES = {
    "SIGTERM": "a preemption notice, a scheduler's or a user's `kill`",
    "SIGINT": "Ctrl-C, or `kill -INT`",
    "SIGUSR1": "a cluster's notice, e.g. SLURM's before the time limit",
}


def signalled_message(rank: int, signal: str, error: BaseException | None = None) -> str:
    """The message for a run that ends because ``rank`` received ``signal`` (``"SIGTERM in training of ..."``)."""
    name = signal.split()[0]
    lines = [
        f"Rank {rank} received {signal} ({_SIGNAL_CAUSES.get(name, 'a signal')}), and the other ranks did not: the"
        " ranks no longer make the same collective calls (Lightning's SIGTERM handler makes one on the signalled rank"
        " alone), so the job would hang until the process-group timeout."
    ]
    if error is not None:
        lines.append(f"  rank {rank} then raised {type(error).__name__}: {error}".rstrip(": "))
    lines.append(FIXES["signal"])
    return "\n".join(lines)


def describe_divergence(points: Sequence[Point]) -> errors.CrossRankError:
    """The error for ranks that reached different points at the same check (or made different collective calls)."""
    listing = [f"  rank {rank}: {point.where}" for rank, point in enumerate(points)]
    facts = [point.facts for point in points]
    signalled = _signalled(facts)
    if signalled is not None:
        return errors.RankSignalledError(_with(signalled, listing, None))
    uneven = _uneven([None if f is None else f.progress for f in facts])
    kinds = [point.kind for point in points]
    if uneven is not None and not all(kind == "loaders" for kind in kinds):
        headline, fix = uneven
        return errors.UnevenBatchesError(_with(headline, listing, fix))
    if all(kind in ("loaders", "batch") for kind in kinds):
        if all(kind == "loaders" for kind in kinds):
            return errors.UnevenBatchesError(_with(_loaders_headline(points), listing, "loaders"))
        return errors.UnevenBatchesError(_with("The ranks ran different numbers of batches:", listing, "loaders"))
    if len({point.identity for point in points}) == 1 or any(kind == "collective" for kind in kinds):
        return errors.DivergentCollectiveError(_with(_collective_headline(points, facts), listing, "collective"))
    if any(kind in _LOGS for kind in kinds):
        headline, fix = _logging_headline(points)
        return errors.DivergentLoggingError(_with(headline, listing, fix))
    headline = "The ranks reached different collective calls, so the job would hang or mix up values:"
    return errors.DivergentCollectiveError(_with(headline, listing, "collective"))


def describe_deadlock(point: Point, waiting: Sequence[Facts], missing: Sequence[Facts]) -> errors.CrossRankError:
    """The error for ranks that wait at ``point``, which the ``missing`` ranks can never reach (see ``blocked_by``)."""
    waiting_ranks = sorted(facts.rank for facts in waiting)
    missing_ranks = sorted(facts.rank for facts in missing)
    listing = [
        *(f"  rank {rank}: waits at {point.where}" for rank in waiting_ranks),
        *(f"  rank {theirs.rank}: {_doing(theirs)}" for theirs in sorted(missing, key=_rank_of)),
    ]
    everyone: list[Facts] = sorted([*waiting, *missing], key=_rank_of)
    signalled = _signalled(everyone)
    if signalled is not None:
        return errors.RankSignalledError(_with(signalled, listing, None))
    uneven = _uneven([theirs.progress for theirs in everyone])
    if uneven is not None:
        headline, fix = uneven
        return errors.UnevenBatchesError(_with(headline, listing, fix))
    calls = [facts for facts in missing if facts.inside is not None]
    if calls:
        parts = [
            f"rank {facts.rank} is blocked in {facts.inside.name} called from {facts.inside.site} (its collective call"
            f" #{facts.inside.index} on the {facts.inside.group} group)"
            for facts in calls
            if facts.inside is not None
        ]
        headline = (
            f"A collective call made on some ranks only: {'; '.join(parts)}, which rank(s) {waiting_ranks} never"
            f" made: they went on to {point.where}. The job would hang until the process-group timeout:"
        )
        return errors.DivergentCollectiveError(_with(headline, listing, "collective"))
    headline = (
        f"Rank(s) {waiting_ranks} wait at {point.where}, which rank(s) {missing_ranks} never reached: they went on into"
        " the backward pass, where DDP all-reduces the gradients, and wait there for the ranks that are stuck at this"
        " call. The job would hang until the process-group timeout:"
    )
    fix = _FIX_OF_KIND.get(point.kind, "collective")
    if point.kind in _LOGS and _is_metric(point):
        fix = "metric"
    cls = errors.DivergentLoggingError if point.kind in _LOGS else errors.DivergentCollectiveError
    return cls(_with(headline, listing, fix))


def _rank_of(facts: Facts) -> int:
    return facts.rank


def _with(headline: str, listing: list[str], fix: str | None) -> str:
    return "\n".join([headline, *listing, *([FIXES[fix]] if fix else [])])


def _doing(facts: Facts) -> str:
    """What a rank that never arrived is doing, from its facts."""
    if facts.inside is not None:
        text = f"is blocked in {facts.inside.name} called from {facts.inside.site}"
    elif facts.backward is not None:
        text = f"is in its synced backward pass #{facts.backward} (DDP's gradient all-reduce)"
    else:
        text = f"is running {facts.at or 'outside user code'}"
    if facts.progress is not None:
        text += f", in {facts.progress.describe()}"
    return text


def _signalled(facts: Sequence[Facts | None]) -> str | None:
    """The headline naming the ranks that received a signal, if any did."""
    having = [(f.rank, f.signal) for f in facts if f is not None and f.signal is not None]
    if not having:
        return None
    rank, signal = having[0]
    headline = signalled_message(rank, signal).splitlines()[0]
    if len(having) > 1:
        others = "; ".join(f"rank {r}: {s}" for r, s in having[1:])
        headline += f" Other ranks that received a signal: {others}."
    return headline + ":"


def _uneven(progress: Sequence[Progress | None]) -> tuple[str, str] | None:
    """The headline when some rank's data ran out before the others', from each rank's progress."""
    known = [(rank, p) for rank, p in enumerate(progress) if p is not None]
    if len(known) < 2:
        return None
    if len({p.epoch for _, p in known}) == 1:
        # ran out: not merely elsewhere (a sanity check, a validation in the middle of the epoch)
        out = [(rank, p) for rank, p in known if p.train_done]
        going = [(rank, p) for rank, p in known if p.stage == "train" and not p.train_done]
        if out and going and max(p.train_batches for _, p in going) >= min(p.train_batches for _, p in out):
            listed = ", ".join(
                f"rank {rank}: {p.train_batches}" + (" and more to come" if (rank, p) in going else "")
                for rank, p in known
            )
            return (
                f"Uneven data: the train dataloader ran out on rank(s) {[rank for rank, _ in out]} in epoch"
                f" {known[0][1].epoch} while rank(s) {[rank for rank, _ in going]} had more batches (training batches"
                f" so far: {listed}); the ranks would run different numbers of steps and hang:",
                "streams",
            )
    if len({(p.epoch, p.eval_loader) for _, p in known}) > 1:
        return None
    loader = known[0][1].eval_loader
    for index in range(max(len(p.eval_batches) for _, p in known)):
        counts = [(rank, p.eval_batches[index] if index < len(p.eval_batches) else 0, p) for rank, p in known]
        fewest = min(count for _, count, _ in counts)
        short = [rank for rank, count, p in counts if count == fewest and p.eval_done]
        if short and any(count > fewest for _, count, _ in counts):
            listed = ", ".join(f"rank {rank}: {count}" for rank, count, _ in counts)
            return (
                f"Uneven data: the {loader} dataloader {index} ran out on rank(s) {short} while the other ranks had"
                f" more batches (batches so far: {listed}); the ranks would run different numbers of steps and hang:",
                "streams",
            )
    return None


def _collective_headline(points: Sequence[Point], facts: Sequence[Facts | None]) -> str:
    """Name the collective call(s) that some ranks made and others did not."""
    named = [f"rank {rank}: {point.where}" for rank, point in enumerate(points) if point.kind == "collective"]
    extra = _extra_calls(facts)
    if extra:
        return (
            "A collective call made on some ranks only: "
            + "; ".join(f"rank {rank} called {call.name} from {call.site}" for rank, call in extra)
            + ", which the other ranks never called. The job would hang or mix up values:"
        )
    if named and len(named) < len(points):
        return (
            f"A collective call made on some ranks only ({'; '.join(named)}), while the other ranks went on. The job"
            " would hang or mix up values:"
        )
    return "The ranks reached different collective calls, so the job would hang or mix up values:"


def _extra_calls(facts: Sequence[Facts | None]) -> list[tuple[int, Call]]:
    """The counted calls that some ranks made beyond the fewest any rank made on the same group."""
    known = [f for f in facts if f is not None]
    groups = {group for f in known for group in f.counts}
    extra = []
    for group in sorted(groups):
        fewest = min(f.counts.get(group, 0) for f in known)
        for f in known:
            extra += [(f.rank, call) for call in f.recent if call.group == group and call.index > fewest]
    return extra


def _loaders_headline(points: Sequence[Point]) -> str:
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


def _logging_headline(points: Sequence[Point]) -> tuple[str, str]:
    if not any(point.kind == "log" for point in points):
        rounds = [point for point in points if point.kind in ("epoch_logs", "step_logs")]
        first = min(point.position for point in rounds)
        return _epoch_keys_headline([point if point.position == first else None for point in points])
    logged = [point for point in points if point.kind == "log"]
    first = min(point.position for point in logged)
    culprits = {(p.detail["name"], p.detail["fx"], p.detail["site"]) for p in logged if p.position == first}
    metric = any(p.detail["reduce"] == "metric" for p in logged if p.position == first)
    parts = []
    for name, fx, site in sorted(culprits):
        having = [
            r for r, p in enumerate(points) if p.kind == "log" and p.position == first and p.detail["name"] == name
        ]
        others = [r for r in range(len(points)) if r not in having]
        parts.append(f"{name!r} ({fx}, {site}) is synced on rank(s) {having} but not on rank(s) {others}")
    headline = "Synced logging differs between ranks: " + "; ".join(parts) + ". The ranks would hang or mix up values:"
    return headline, "metric" if metric else "log"


def _epoch_keys_headline(points: Sequence[Point | None]) -> tuple[str, str]:
    """The keys of the first epoch-end round that not every rank syncs (``None``: a rank that went on past it)."""
    keys_by_rank = [[] if p is None else [(entry["name"], entry["fx"]) for entry in _entries(p)] for p in points]
    entries = {(entry["name"], entry["fx"]): entry for p in points if p is not None for entry in _entries(p)}
    everyone = list(dict.fromkeys(key for keys in keys_by_rank for key in keys))
    parts, metric = [], False
    for key in everyone:
        having = [rank for rank, keys in enumerate(keys_by_rank) if key in keys]
        lacking = [rank for rank, keys in enumerate(keys_by_rank) if key not in keys]
        if lacking:
            parts.append(
                f"{key[0]!r} ({entries[key]['site']}) is synced on rank(s) {having} but not on rank(s) {lacking}"
            )
            metric = metric or entries[key]["reduce"] == "metric"
    if not parts:
        parts.append("the same keys are synced in a different order on different ranks")
    headline = "Synced logging differs between ranks: " + "; ".join(parts) + ". The ranks would hang or mix up values:"
    return headline, "metric" if metric else "log"


def _entries(point: Point) -> list[dict[str, str]]:
    if point.kind == "log":
        return [point.detail]
    if point.kind in ("epoch_logs", "step_logs"):
        return list(point.detail)
    return []


def _is_metric(point: Point) -> bool:
    return any(entry["reduce"] == "metric" for entry in _entries(point))


def count_text(count: float) -> str:
    """A batch count for people: ``"no length"`` for a loader without one."""
    return "no length" if count == float("inf") else str(int(count))
