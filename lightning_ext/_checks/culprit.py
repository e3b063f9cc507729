"""Which ranks made the call that the others did not, from the facts each rank reports; pure, testable in one process.

Lightning runs the same loop code on every rank, so ranks that part ways do so in the user's code. Each rank reports
where it stands (:class:`Stand`): the call it is at or blocked in, whether the user's code makes it, the hook it is in
and how far it got. The rule is written down in ``docs/hang-checks.md`` ("Who is named").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_ext._checks.points import Point
from lightning_ext._watch.rank_facts import Call, Facts

__all__ = ["Stand", "blocked_stand", "culprits", "extra_call_stands", "split_keys", "stand_at"]


@dataclass(frozen=True)
class Stand:
    """Where one rank stands when the ranks part ways.

    Attributes:
        rank: the rank.
        kind: ``"log"`` (a step value's sync), ``"step_logs"`` (a hook's step values, synced together when it
            returns), ``"epoch_logs"`` (an epoch-end sync round), ``"collective"`` (a checked
            collective call), ``"call"`` (inside a counted ``torch.distributed`` call), ``"backward"`` (DDP's gradient
            all-reduce), or the kind of another check (``"end"``, ``"loaders"``, ``"batch"``).
        call: the call, in a few words (``self.log('acc', sync_dist=True)``, ``strategy.barrier('x')``).
        where: what the rank is at, for a detail line.
        site: the user's line that makes the call, or ``None`` where Lightning's own flow makes it.
        hook: the hook the rank is in, or ``None`` between hooks.
        batches: the batches it has started in the run, in every stage: how far it got.
        keys: the synced keys of a log or of an epoch-end round, as the logging checks describe them.
        stage: the stage it is in (``"sanity_check"``, ``"train"``, ...), or ``None``.

    """

    rank: int
    kind: str
    call: str
    where: str
    site: str | None = None
    hook: str | None = None
    batches: int = 0
    keys: tuple[dict[str, Any], ...] = ()
    stage: str | None = None

    @property
    def users(self) -> bool:
        """Whether the user's code made this call (a synced key is always the user's, whichever hook logged it)."""
        return self.site is not None or bool(self.keys)


def culprits(stands: Sequence[Stand]) -> list[Stand]:
    """The stands of the ranks that made a call which the other ranks did not make there; empty if no rank stands at
    a call of the user's code.

    The ranks passed every earlier check together, and no rank makes a checked call between two checks. So the ranks
    that got least far, at a call of the user's code, are still where the others went past without making it: theirs
    is the extra call. How far: the batches started (every stage), then, within a batch, the hook (``training_step``
    before ``on_train_batch_end``, the epoch-end hooks, then the epoch-end sync; a hook's step values, synced when it
    returns, after every call in its body), then, within one function, the line.
    A call that Lightning's own flow makes is made by every rank in the same place: it is where the others went on,
    never the culprit. Different calls equally far (keys that differ by rank) are all named.

    Example:
        >>> logged = Stand(0, "epoch_logs", "the sanity check epoch-end sync", "round", batches=2, keys=({},))
        >>> barrier = Stand(1, "collective", "strategy.barrier('train_dataloader()')", "setup", batches=2)
        >>> [stand.rank for stand in culprits([logged, barrier])]
        [0]

    """
    found = [stand for stand in stands if stand.users]
    if not found:
        return []
    behind = min(stand.batches for stand in found)
    found = [stand for stand in found if stand.batches == behind]
    within = [_within_batch(stand) for stand in found]
    if all(index is not None for index in within) and len(set(within)) > 1:
        first = min(index for index in within if index is not None)
        found = [stand for stand, index in zip(found, within, strict=True) if index == first]
    places = [_place(stand.site) for stand in found]
    if len(places) > 1 and all(place is not None for place in places) and len({p[:2] for p in places if p}) == 1:
        line = min(place[2] for place in places if place is not None)
        found = [stand for stand, place in zip(found, places, strict=True) if place is not None and place[2] == line]
    return found


def split_keys(found: Sequence[Stand], world: int) -> list[tuple[dict[str, Any], list[int]]]:
    """Each synced key of the ``found`` stands that not all ``world`` ranks sync there, in the order logged, with the
    ranks that sync it (a rank elsewhere syncs none of them)."""
    entries: dict[tuple[Any, ...], dict[str, Any]] = {}
    having: dict[tuple[Any, ...], list[int]] = {}
    for stand in found:
        for entry in stand.keys:
            key = (entry["name"], entry["fx"], entry["dataloader"])
            entries.setdefault(key, entry)
            having.setdefault(key, []).append(stand.rank)
    return [(entries[key], ranks) for key, ranks in having.items() if len(set(ranks)) < world]


def stand_at(rank: int, point: Point, facts: Facts | None) -> Stand:
    """A rank waiting at ``point`` (a check), with its ``facts``."""
    keys: tuple[dict[str, Any], ...] = ()
    hook = _hook(facts)
    if point.kind == "log":
        keys, hook = (point.detail,), point.detail["fx"]
    elif point.kind == "step_logs":
        keys, hook = tuple(point.detail), point.detail[0]["fx"]
    elif point.kind == "epoch_logs":
        keys = tuple(point.detail)
    batches = 0 if facts is None else facts.batches
    stage = None if facts is None or facts.progress is None else facts.progress.stage
    return Stand(rank, point.kind, point.call or point.where, point.where, point.site, hook, batches, keys, stage=stage)


def blocked_stand(facts: Facts) -> Stand:
    """A rank that never arrived at a check: inside a collective call, or in DDP's gradient all-reduce."""
    stage = None if facts.progress is None else facts.progress.stage
    if facts.inside is not None:
        return _call_stand(facts, facts.inside, stage)
    where = "the backward pass, where DDP all-reduces the gradients"
    return Stand(facts.rank, "backward", where, where, None, _hook(facts), facts.batches, stage=stage)


def extra_call_stands(facts: Sequence[Facts | None]) -> list[Stand]:
    """The counted calls that some ranks made beyond the fewest any rank made on the same group, as stands."""
    known = [f for f in facts if f is not None]
    stands = []
    for group in sorted({group for f in known for group in f.counts}):
        fewest = min(f.counts.get(group, 0) for f in known)
        for f in known:
            stage = None if f.progress is None else f.progress.stage
            stands += [_call_stand(f, call, stage) for call in f.recent if call.group == group and call.index > fewest]
    return stands


def _call_stand(facts: Facts, call: Call, stage: str | None) -> Stand:
    site = None if call.lightning else call.site
    where = f"{call.name} called from {call.site}"
    return Stand(facts.rank, "call", call.name, where, site, _hook(facts), facts.batches, stage=stage)


# the hooks of one batch in Lightning's order, the epoch-end hooks, then the epoch-end sync (``_within_batch``)
_ORDER = {
    hook: index
    for index, hook in enumerate(
        (
            *("on_train_batch_start", "training_step", "on_before_backward", "backward", "on_after_backward"),
            *("on_before_optimizer_step", "optimizer_step", "on_before_zero_grad", "optimizer_zero_grad"),
            *("on_train_batch_end", "on_validation_batch_start", "validation_step", "on_validation_batch_end"),
            *("on_test_batch_start", "test_step", "on_test_batch_end"),
            *("on_train_epoch_end", "on_validation_epoch_end", "on_test_epoch_end"),
        )
    )
}
_SITE = re.compile(r"^(?P<path>.+):(?P<line>\d+) in (?P<function>.+)$")


def _within_batch(stand: Stand) -> float | None:
    """Where in its batch a rank stands: the hook's place in Lightning's order (the epoch-end sync last); a hook's
    step values sync when it returns, so a rank at their check has passed every call the hook body makes."""
    if stand.kind == "epoch_logs":
        return len(_ORDER)
    index = _ORDER.get(stand.hook or "")
    return None if index is None else index + 0.5 * (stand.kind == "step_logs")


def _place(site: str | None) -> tuple[str, str, int] | None:
    """``(path, function, line)`` of a user's site (``"model.py:40 in validation_step"``)."""
    found = None if site is None else _SITE.match(site)
    return None if found is None else (found["path"], found["function"], int(found["line"]))


def _hook(facts: Facts | None) -> str | None:
    return None if facts is None or facts.progress is None else facts.progress.hook
