"""A check's point: what a rank is about to do, its fingerprint, and its description for people."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightning_ext._watch.rank_facts import Facts
from lightning_ext._watch.sites import Caller

__all__ = ["LOGGING", "Label", "Point", "collective_point", "fingerprint_at", "labelled"]

Label = str | Callable[[], str]
LOGGING = ("log", "step_logs", "epoch_logs")  # the kinds of point where synced logging is checked


@dataclass(frozen=True)
class Point:
    """One checkpoint: what a rank is about to do.

    Attributes:
        kind: ``"log"`` (one value), ``"step_logs"`` (a hook's step values, synced together), ``"epoch_logs"`` (an
            epoch-end round), ``"loaders"``, ``"collective"`` or ``"batch"``; picks the error class.
        identity: what must be equal on every rank (hashed into the fingerprint).
        where: what it is, for people: ``self.log('loss', sync_dist=True) in training_step (model.py:31)``.
        detail: extra data for the error message and for resolving a mismatch (e.g. batch counts).
        call: the call, in a few words, for an error's first line: ``self.log('loss', sync_dist=True)``,
            ``strategy.broadcast() via Trainer.log_dir``.
        site: where the user's code makes the call (``model.py:31 in training_step``); ``None`` where Lightning's own
            flow makes it, which every rank reaches (a check there is never the one that some ranks made alone).

    """

    kind: str
    identity: tuple[Any, ...]
    where: str
    detail: Any = field(default=None, compare=False)
    position: int = field(default=0, compare=False)  # set on the error path: where in the run (a batch number)
    facts: Facts | None = field(default=None, compare=False)  # set on the error path: the rank's facts then
    call: str = field(default="", compare=False)
    site: str | None = field(default=None, compare=False)

    @functools.cached_property
    def fingerprint(self) -> int:
        """A 62-bit digest of ``identity`` (it fits an int64, sent as one)."""
        return _fingerprint(self.identity)


def collective_point(call: str, identity: tuple[Any, ...], caller: Caller) -> Point:
    """The check before a collective call of the strategy (``strategy.barrier('x')``) that ``caller`` made.

    Whose flow made the call is part of what must agree: a rank-guarded ``strategy.broadcast`` of the user's must not
    pass as the broadcast that Lightning makes on the other ranks at that moment (Lightning 2.5's ``ModelCheckpoint``
    broadcasts in every validation), which would mix up their values. Every rank reaches a call of a correct program
    through the same code, so this adds no false alarm.
    """
    via = f"via {caller.api} " if caller.api else ""
    short = f"{caller.api} ({call.split('(')[0]})" if caller.api and not caller.lightning else call
    site = None if caller.lightning else caller.site
    where = f"{call} {via}called from {caller.site}"
    return Point("collective", (*identity, caller.lightning), where, call=short, site=site)


def fingerprint_at(fingerprint: int, position: int, calls: int) -> int:
    """``fingerprint`` made specific to ``position`` and to the number of collective calls made so far (62 bits)."""
    if position:
        fingerprint ^= position * 0x9E3779B97F4A7C15
    if calls:
        fingerprint ^= calls * 0xC2B2AE3D27D4EB4F
    return fingerprint & 0x3FFFFFFFFFFFFFFF


def labelled(point: Point, position: int, label: Label) -> Point:
    """``point`` described with its ``label`` (``"... at batch_idx 3 of training"``), for an error message."""
    text = label() if callable(label) else label
    return dataclasses.replace(point, where=f"{point.where} at {text}", position=position) if text else point


@functools.lru_cache(maxsize=4096)
def _fingerprint(identity: tuple[Any, ...]) -> int:
    digest = hashlib.blake2b(repr(identity).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2
