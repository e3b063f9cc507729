"""A rank's facts as plain data: its counted collective calls, its check, backward passes, progress, signal; pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_ext._watch.progress import Progress

__all__ = ["WORLD", "Call", "Facts"]

WORLD = "world"  # the default group's name in a rank's counts (``Facts.counts``, ``Call.group``)


@dataclass(frozen=True)
class Call:
    """A collective call of the training thread, counted per process group.

    Attributes:
        group: the group's name (``"world"`` for the default group); only groups of every rank are counted.
        index: this call's number among the counted calls on that group (1 for the first).
        name: what was called, for people: ``torch.distributed.all_gather (via LightningModule.all_gather)``.
        site: where in the user's code: ``model.py:40 in validation_step``.
        lightning: whether Lightning's own flow made it (the user's code only called ``trainer.fit``, ``validate``,
            ...): every rank makes such a call in its normal flow, so it is never the call that some ranks made alone.

    """

    group: str
    index: int
    name: str
    site: str
    lightning: bool = False


@dataclass(frozen=True)
class Facts:
    """One rank's report about itself.

    Attributes:
        rank: the rank.
        check: the lightning-ext check it waits in, as ``(number, description)``, or ``None``.
        checks: the number of the last check it has passed (every rank numbers the checks alike).
        counts: its counted collective calls so far, per group.
        inside: the counted collective call its training thread is inside now, or ``None``.
        backward: the number of the synced backward pass it is in now (DDP's gradient all-reduce runs in it), or
            ``None``; a backward pass without gradient sync, or whose sync is unknown, is not counted.
        backwards: synced backward passes completed.
        progress: where it is in Lightning's loops.
        signal: the signal it received (``"SIGTERM in training of epoch 0, ..."``), or ``None``.
        recent: its last counted collective calls outside backward passes, oldest first (to name a call that other
            ranks did not make).
        at: the innermost frame of user code, for people only (never part of a verdict).
        batches: the batches it has started in the run, in every stage (how far it got: to name the ranks behind).

    """

    rank: int
    check: tuple[int, str] | None = None
    checks: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    inside: Call | None = None
    backward: int | None = None
    backwards: int = 0
    progress: Progress | None = None
    signal: str | None = None
    recent: tuple[Call, ...] = ()
    at: str | None = None
    batches: int = 0
