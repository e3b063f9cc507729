"""The hang checks' error messages: the true cause, where it is, and a fix that works; pure functions.

Every message starts with one line, under ``FIRST_LINE`` characters at any world size, that names the cause, the
user's line and the fix; then one line per group of ranks doing the same thing (at most ``DETAIL_GROUPS``); then the
fix in full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lightning_ext import errors
from lightning_ext._checks.culprit import Stand, blocked_stand, culprits, extra_call_stands, split_keys, stand_at
from lightning_ext._checks.points import LOGGING, Point
from lightning_ext._rank_lists import ranks_text
from lightning_ext._watch.progress import Progress
from lightning_ext._watch.rank_facts import Facts
from lightning_ext._watch.rank_text import FIRST_LINE, doing, grouped_lines, short_site, shortened

__all__ = [
    "FIXES",
    "batch_counts",
    "count_text",
    "describe_deadlock",
    "describe_divergence",
    "first_line",
    "signalled_message",
]

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
_ADVICE = {  # the fix in a few words, for the first line
    "log": "Fix: log it on every rank.",
    "log_zero": "Fix: log it on every rank, or with rank_zero_only=True.",
    "keys": "Fix: log the same keys on every rank.",
    "metric": "Fix: update and log the metric on every rank.",
    "collective": "Fix: call it on every rank.",
    "collectives": "Fix: make the same collective calls on every rank.",
    "loaders": "Fix: as many batches on every rank, or uneven_batches='truncate'.",
    "streams": "Fix: as many batches on every rank.",
}
_SIGNAL_CAUSES = {
    "SIGTERM": "a preemption notice, a scheduler's or a user's `kill`",
    "SIGINT": "Ctrl-C, or `kill -INT`",
    "SIGUSR1": "a cluster's notice, e.g. SLURM's before the time limit",
}
_MOST_KEYS = 8  # the keys synced on some ranks only, listed on one line
_WIDTHS = ((70, 40), (44, 28), (30, 18))  # the longest call and file name in a first line, tried in turn


def signalled_message(rank: int, signal: str, error: BaseException | None = None) -> str:
    """The message for a run that ends because ``rank`` received ``signal`` (``"SIGTERM in training of ..."``)."""
    name = signal.split()[0]
    lines = [
        first_line(
            f"Rank {rank} received {signal}, and the other ranks did not"
            f" ({_SIGNAL_CAUSES.get(name, 'a signal')}): the job would hang.",
            "",
        ),
        "The ranks no longer make the same collective calls (Lightning's SIGTERM handler makes one on the signalled"
        " rank alone), so the job would hang until the process-group timeout.",
    ]
    if error is not None:
        lines.append(f"  rank {rank} then raised {type(error).__name__}: {error}".rstrip(": "))
    lines.append(FIXES["signal"])
    return "\n".join(lines)


def first_line(cause: str, advice: str) -> str:
    """``cause`` and ``advice`` on one line, the advice dropped (then the cause cut) where it would be too long."""
    both = f"{cause} {advice}".strip()
    return both if len(both) <= FIRST_LINE else shortened(cause, FIRST_LINE)


def describe_divergence(points: Sequence[Point]) -> errors.CrossRankError:
    """The error for ranks that reached different points at the same check (or made different collective calls)."""
    facts = [point.facts for point in points]
    listing = grouped_lines((rank, f"at {point.where}") for rank, point in enumerate(points))
    signalled = _signalled(facts)
    if signalled is not None:
        return errors.RankSignalledError(_text(signalled, "", listing, "signal"))
    kinds = [point.kind for point in points]
    ran_out = _uneven([None if f is None else f.progress for f in facts])
    if ran_out is not None and not all(kind == "loaders" for kind in kinds):
        return errors.UnevenBatchesError(_text(ran_out[0], _ADVICE["streams"], ran_out[1], "streams"))
    if all(kind == "loaders" for kind in kinds):
        head, lines = _loaders_headline(points)
        return errors.UnevenBatchesError(_text(head, _ADVICE["loaders"], lines, "loaders"))
    if all(kind in ("loaders", "batch") for kind in kinds):
        return errors.UnevenBatchesError(_text("The ranks ran different numbers of batches.", "", listing, "loaders"))
    stands = [stand_at(rank, point, point.facts) for rank, point in enumerate(points)]
    if len({point.identity for point in points}) == 1:  # the same point, after different collective calls
        extra = extra_call_stands(facts)
        firsts = {stand.rank: stand for stand in reversed(extra)}  # each rank's first extra call
        everyone = [firsts.get(stand.rank, stand) for stand in stands]
        found = culprits(list(firsts.values()))  # every rank makes the call at the point: it is not the extra one
        if found:
            return _blame(found, everyone, _placed(found, everyone))
        if extra:
            lowest = sorted(firsts.values(), key=_rank_of_stand)[:2]  # the two lowest ranks' first extra calls
            named = "; ".join(f"rank {stand.rank}: {stand.where}" for stand in lowest)
            head = f"A collective call made on some ranks only ({shortened(named, 150)})."
            return errors.DivergentCollectiveError(_text(head, _ADVICE["collectives"], listing, "collective"))
    if all(kind == "step_logs" for kind in kinds) and len({point.identity[:2] for point in points}) == 1:
        return _layouts_differ(points, stands[0])
    found = culprits(stands)
    if found:
        return _blame(found, stands, _placed(found, stands))
    head = "The ranks reached different collective calls, so the job would hang or mix up values."
    return errors.DivergentCollectiveError(_text(head, "", listing, "collective"))


def describe_deadlock(point: Point, waiting: Sequence[Facts], missing: Sequence[Facts]) -> errors.CrossRankError:
    """The error for ranks that wait at ``point``, which the ``missing`` ranks can never reach (see ``blocked_by``)."""
    everyone: list[Facts] = sorted([*waiting, *missing], key=_rank_of)
    waiting_ranks = {facts.rank for facts in waiting}
    listing = grouped_lines(
        (facts.rank, f"waits at {point.where}" if facts.rank in waiting_ranks else doing(facts)) for facts in everyone
    )
    signalled = _signalled(everyone)
    if signalled is not None:
        return errors.RankSignalledError(_text(signalled, "", listing, "signal"))
    ran_out = _uneven([theirs.progress for theirs in everyone])
    if ran_out is not None:
        return errors.UnevenBatchesError(_text(ran_out[0], _ADVICE["streams"], ran_out[1], "streams"))
    stands = [stand_at(f.rank, point, f) if f.rank in waiting_ranks else blocked_stand(f) for f in everyone]
    found = culprits(stands)
    if found:
        return _blame(found, stands, listing)
    others = sorted({facts.rank for facts in missing})
    head = (
        f"{ranks_text(waiting_ranks, 3)} waited at {shortened(point.call or point.where, 80)}, which"
        f" {ranks_text(others, 3)} can never reach: the job would hang until the process-group timeout."
    )
    cls = errors.DivergentLoggingError if point.kind in LOGGING else errors.DivergentCollectiveError
    return cls(_text(head, "", listing, "log" if point.kind in LOGGING else "collective"))


def _blame(found: Sequence[Stand], everyone: Sequence[Stand], listing: list[str]) -> errors.CrossRankError:
    """The error that names the ``found`` ranks' call(s) as the cause, and the other ranks as those that went on."""
    if all(stand.keys for stand in found):
        return _blame_logging(found, everyone, listing)
    having = [stand.rank for stand in found]
    others = [stand.rank for stand in everyone if stand.rank not in having]
    calls = list(dict.fromkeys((stand.call, stand.site, stand.hook) for stand in found))
    if len(calls) == 1:
        call, site, hook = calls[0]
        head = _fitted(
            lambda width, file: (
                f"{shortened(call, width)}{_where(hook, found[0].stage, site, file)} ran on"
                f" {ranks_text(having, 3)} only; {_others(others)} went on."
            )
        )
        return errors.DivergentCollectiveError(_text(head, _ADVICE["collective"], listing, "collective"))
    parts = [
        f"{ranks_text([s.rank for s in found if (s.call, s.site, s.hook) == c], 2)}"
        f" {shortened(c[0], 50)}{_where(None, None, c[1], 24)}"
        for c in calls[:2]
    ]
    more = f" and {len(calls) - 2} more" if len(calls) > 2 else ""
    head = "The ranks made different collective calls: " + "; ".join(parts) + more + "."
    return errors.DivergentCollectiveError(_text(head, _ADVICE["collectives"], listing, "collective"))


def _blame_logging(found: Sequence[Stand], everyone: Sequence[Stand], listing: list[str]) -> errors.CrossRankError:
    split = split_keys(found, len(everyone))
    stage = found[0].stage
    if not split:
        entry = found[0].keys[0]
        head = (
            "Synced logging differs between ranks: the same keys are synced in a different order"
            f"{_where(entry['fx'], stage, entry['site'])}."
        )
        return errors.DivergentLoggingError(_text(head, _ADVICE["keys"], listing, "log"))
    metric = any(entry["reduce"] == "metric" for entry, _ in split)
    fix = "metric" if metric else "log"
    groups: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for entry, ranks in split:
        groups.setdefault(tuple(sorted(set(ranks))), []).append(entry)
    keys = [] if len(split) == 1 else [_keys_line(split)]
    if len(groups) == 1:
        ((having, entries),) = groups.items()
        entry = entries[0]
        lacking = [stand for stand in everyone if stand.rank not in having]
        there = all(stand.kind == found[0].kind and stand.batches == found[0].batches for stand in lacking)
        more = f" (and {len(entries) - 1} more key(s))" if len(entries) > 1 else ""
        head = _fitted(
            lambda width, file: (
                f"{shortened(entry['call'], width)}{more}{_where(entry['fx'], stage, entry['site'], file)}"
                f" synced on {ranks_text(having, 3)} only; {_others([s.rank for s in lacking])}"
                f" {'did not sync it' if there else 'went on'}."
            )
        )
        advice = "metric" if metric else "log_zero" if having == (0,) else "log"
        return errors.DivergentLoggingError(_text(head, _ADVICE[advice], [*listing, *keys], fix))
    ordered = sorted(groups.items(), key=lambda group: group[0])
    rest = sum(len(having) for having, _ in ordered[2:])
    more = f", {rest} more rank(s) other keys" if rest else ""
    entry = ordered[0][1][0]

    def head_of(width: int, file: int) -> str:
        parts = [
            f"{ranks_text(having, 2)} sync{'s' if len(having) == 1 else ''} {shortened(named[0]['name'], width // 2)!r}"
            for having, named in ordered[:2]
        ]
        return (
            f"Synced logging differs between ranks{_where(entry['fx'], stage, entry['site'], file)}: "
            + ", ".join(parts)
            + f"{more}."
        )

    head = _fitted(head_of)
    return errors.DivergentLoggingError(_text(head, _ADVICE["metric" if metric else "keys"], [*listing, *keys], fix))


def _keys_line(split: Sequence[tuple[dict[str, Any], list[int]]]) -> str:
    listed = [
        f"{entry['name']!r} ({entry['fx']}, {short_site(entry['site'])}: {ranks_text(ranks, 2)})"
        for entry, ranks in split[:_MOST_KEYS]
    ]
    more = f" and {len(split) - _MOST_KEYS} more" if len(split) > _MOST_KEYS else ""
    return "  synced on some ranks only: " + ", ".join(listed) + more


def _layouts_differ(points: Sequence[Point], stand: Stand) -> errors.CrossRankError:
    """The same synced keys with values of another dtype or device by rank (their packs' all-reduces would not meet)."""
    lines = grouped_lines((rank, f"values {_layout(point.identity[2])}") for rank, point in enumerate(points))
    names = shortened(", ".join(repr(entry["name"]) for entry in stand.keys), 60)
    head = (
        f"The synced values of {names}{_where(stand.hook, stand.stage, stand.site)} differ in dtype or device by rank."
    )
    advice = "Fix: the same dtype and device on every rank."
    return errors.DivergentLoggingError("\n".join([first_line(head, advice), *lines]))


def _layout(packs: tuple[tuple[str, str, int, str], ...]) -> str:
    return ", ".join(
        f"{count} {dtype}{'' if device == 'cpu' else f' on {device}'} ({op})" for op, dtype, count, device in packs
    )


def _placed(found: Sequence[Stand], everyone: Sequence[Stand]) -> list[str]:
    """Each rank's line: ``at ...`` where the culprits are (or at their place), ``went on to ...`` elsewhere."""
    place = (found[0].kind, found[0].batches)
    return grouped_lines(
        (stand.rank, f"{'at' if (stand.kind, stand.batches) == place else 'went on to'} {stand.where}")
        for stand in everyone
    )


def _where(hook: str | None, stage: str | None, site: str | None, longest: int = 40) -> str:
    """`` in on_validation_epoch_end (sanity check, train.py:31)``: the hook, the sanity check (it runs before
    training, so users may not expect it there), and the user's file (its name cut to ``longest``) and line."""
    sanity = "sanity check, " if stage == "sanity_check" else ""
    return (f" in {hook}" if hook else "") + f" ({sanity}{short_site(site, longest)})"


def _fitted(build: Callable[[int, int], str]) -> str:
    """``build(longest call, longest file name)``, with the call and the file's name cut shorter where needed to fit
    the first line (names of that length are rare: the other parts of the line are short at any world size)."""
    for call, file in _WIDTHS:
        text = build(call, file)
        if len(text) <= FIRST_LINE:
            break
    return text


def _others(ranks: Sequence[int]) -> str:
    """``ranks 1-7``; ``the other 512`` where the ranks do not make a few ranges."""
    text = ranks_text(ranks, 3)
    return f"the other {len(ranks)}" if " more" in text else text


def _text(head: str, advice: str, lines: Iterable[str], fix: str) -> str:
    return "\n".join([first_line(head, advice), *lines, FIXES[fix]])


def _rank_of(facts: Facts) -> int:
    return facts.rank


def _rank_of_stand(stand: Stand) -> int:
    return stand.rank


def _signalled(facts: Sequence[Facts | None]) -> str | None:
    """The headline naming the ranks that received a signal, if any did."""
    having = [(f.rank, f.signal) for f in facts if f is not None and f.signal is not None]
    if not having:
        return None
    rank, signal = having[0]
    if len(having) == 1:
        return signalled_message(rank, signal).splitlines()[0]
    others = ranks_text([r for r, _ in having[1:]], 3)
    return first_line(f"Rank {rank} received {signal}, and {others} a signal too: the job would hang.", "")


# ---- uneven data: which rank's loader ran out first, and each rank's batches ------------------------------
def _uneven(progress: Sequence[Progress | None]) -> tuple[str, list[str]] | None:
    """The headline and detail lines when some rank's data ran out before the others', from each rank's progress.

    The culprit is a rank whose loader ended with fewer batches than another's ended with, or one that is known to
    have more (a rank that has not run out after as many batches: Lightning fetches one batch ahead); a rank that is
    only behind in time is never named.
    """
    known = [(rank, p) for rank, p in enumerate(progress) if p is not None]
    if len(known) < 2:
        return None
    if len({p.epoch for _, p in known}) == 1:
        # ran out: not merely elsewhere (a sanity check, a validation in the middle of the epoch)
        ended = {rank: p.train_batches for rank, p in known if p.train_done}
        going = {rank: p.train_batches for rank, p in known if p.stage == "train" and not p.train_done}
        fewest = min(ended.values(), default=0)
        more = [rank for rank, count in going.items() if ended and count >= fewest]
        if ended and (more or len(set(ended.values())) > 1):
            short = [rank for rank, count in ended.items() if count == fewest]
            longest = max(ended.values())
            if longest > fewest:
                other = f"but after {longest} on {ranks_text([r for r, c in ended.items() if c == longest], 3)}"
            else:
                other = f"while {ranks_text(more, 3)} had more"
            head = (
                f"Uneven data in epoch {known[0][1].epoch}: the train dataloader ran out after {fewest} batch(es) on"
                f" {ranks_text(short, 3)} {other}."
            )
            return head, grouped_lines((rank, _train_progress(p)) for rank, p in known)
    # the ranks' evaluation runs: a rank with no batches counted there is elsewhere (after the sanity check, whose
    # counts are reset), so is a rank in the sanity check while another is not
    known = [(rank, p) for rank, p in known if p.eval_batches]
    if len(known) < 2 or len({(p.epoch, p.eval_loader, p.stage == "sanity_check") for _, p in known}) > 1:
        return None
    loader = known[0][1].eval_loader
    for index in range(max(len(p.eval_batches) for _, p in known)):
        counts = [(rank, p.eval_batches[index] if index < len(p.eval_batches) else 0, p) for rank, p in known]
        fewest = min(count for _, count, _ in counts)
        short = [rank for rank, count, p in counts if count == fewest and p.eval_done]
        more = [rank for rank, count, _ in counts if count > fewest]
        if short and more:
            head = (
                f"Uneven data: the {loader} dataloader {index} ran out after {fewest} batch(es) on"
                f" {ranks_text(short, 3)} while {ranks_text(more, 3)} had more."
            )
            lines = grouped_lines(
                (rank, f"{count} batch(es)" + (", ran out" if p.eval_done else ", more to come"))
                for rank, count, p in counts
            )
            return head, lines
    return None


def _train_progress(progress: Progress) -> str:
    if progress.train_done:
        return f"ran out after {progress.train_batches} training batch(es)"
    if progress.stage == "train":
        return f"{progress.train_batches} training batch(es) so far, and more to come"
    return progress.describe()


def _loaders_headline(points: Sequence[Point]) -> tuple[str, list[str]]:
    details: list[Any] = [point.detail for point in points]
    stage = details[0]["stage"]
    names = details[0]["names"]
    if any(detail["stage"] != stage or detail["names"] != names for detail in details):
        return "The ranks set up different dataloaders.", grouped_lines(
            (rank, point.where) for rank, point in enumerate(points)
        )
    parts = []
    for position, name in enumerate(names):
        counts = [detail["counts"][position] for detail in details]
        if len(set(counts)) > 1:
            parts.append(f"the {name} has {batch_counts(counts)}")
    more = f"; and {len(parts) - 1} more dataloader(s)" if len(parts) > 1 else ""
    lines = grouped_lines(
        (rank, ", ".join(f"{name}: {_batches(count)}" for name, count in zip(names, detail["counts"], strict=True)))
        for rank, detail in enumerate(details)
    )
    return f"Uneven data in {stage}: {parts[0]}{more}.", lines


def batch_counts(counts: Sequence[float]) -> str:
    """Each rank's batch count (``counts[rank]``), the two fewest with their ranks and the rest as a count of ranks.

    Example:
        >>> batch_counts([4, 5, 4, 4])
        '4 batches on ranks 0, 2 and 3 but 5 on rank 1'
        >>> batch_counts([3, 4, 5, 6, 7])
        '3 batches on rank 0 but 4 on rank 1, and other counts on 3 more ranks'

    """
    by_count: dict[float, list[int]] = {}
    for rank, count in enumerate(counts):
        by_count.setdefault(count, []).append(rank)
    ordered = sorted(by_count.items())
    shown = [f"{_batches(count) if index == 0 else count_text(count)} on {ranks_text(ranks, 2)}"
             for index, (count, ranks) in enumerate(ordered[:2])]  # fmt: skip
    rest = sum(len(ranks) for _, ranks in ordered[2:])
    return " but ".join(shown) + (f", and other counts on {rest} more ranks" if rest else "")


def _batches(count: float) -> str:
    return "no length" if count == float("inf") else f"{int(count)} batch" + ("" if count == 1 else "es")


def count_text(count: float) -> str:
    """A batch count for people: ``"no length"`` for a loader without one."""
    return "no length" if count == float("inf") else str(int(count))
