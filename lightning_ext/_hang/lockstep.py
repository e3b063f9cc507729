"""Lockstep: every rank must pass the same checks in the same order; the first difference is an error."""

import dataclasses
import functools
import hashlib
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from lightning_ext import _collective, errors
from lightning_ext._hang.messages import describe_deadlock, describe_divergence
from lightning_ext._hang.watchdog import ErrorRecord, Location, Watchdog
from lightning_ext.errors import mark_joint

__all__ = ["Lockstep", "Point", "raise_record", "record_of"]

_FIRST_WAIT = 2.0  # seconds before a waiting rank asks where the others are
_NEXT_WAIT = 1.0  # between two looks: a rank is stuck only if it has not moved in between
_MAX_WAIT = 30.0


@dataclass(frozen=True)
class Point:
    """One checkpoint: what a rank is about to do.

    Attributes:
        kind: ``"log"``, ``"epoch_logs"``, ``"loaders"``, ``"collective"`` or ``"batch"``; picks the error class.
        identity: what must be equal on every rank (hashed into the fingerprint).
        where: what it is, for people: ``self.log('loss', sync_dist=True) in training_step (model.py:31)``.
        detail: extra data for the error message and for resolving a mismatch (e.g. batch counts).

    """

    kind: str
    identity: tuple[Any, ...]
    where: str
    detail: Any = field(default=None, compare=False)
    position: int = field(default=0, compare=False)  # set on the error path: where in the run (a batch number)

    @property
    def fingerprint(self) -> int:
        """A 62-bit digest of ``identity`` (it fits an int64, sent as one)."""
        return _fingerprint(self.identity)


def _at(fingerprint: int, position: int) -> int:
    """``fingerprint`` made specific to ``position`` (still 62 bits)."""
    if not position:
        return fingerprint
    return (fingerprint ^ (position * 0x9E3779B97F4A7C15)) & 0x3FFFFFFFFFFFFFFF


@functools.lru_cache(maxsize=4096)
def _fingerprint(identity: tuple[Any, ...]) -> int:
    digest = hashlib.blake2b(repr(identity).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


class Lockstep:
    """The checks of one rank in one run (a no-op at world size 1).

    Args:
        group: the gloo group of the checks (see :func:`lightning_ext._collective.side_group`).
        watchdog: this rank's watchdog.
        before_error: called before this rank raises any error here (flushes per-rank files).

    """

    def __init__(self, group: Any, watchdog: Watchdog, before_error: Callable[[], None]) -> None:
        self.group = group
        self.watchdog = watchdog
        self.rank = watchdog.rank
        self.world_size = watchdog.world_size
        self.count = 0  # checks started by this rank (including those its watchdog completes for it)
        self._before_error = before_error
        self._lock = threading.Lock()
        self._fillers: list[Any] = []
        watchdog.on_error = self.complete_pending

    def agree(self, point: Point, position: int = 0) -> bool:
        """Whether every rank is at the same point (and ``position``, e.g. the batch). Raises a posted error."""
        posted = self.watchdog.posted()
        if posted is not None:
            self._before_error()
            raise_record(posted)
        fingerprint = _at(point.fingerprint, position)
        with self._lock:
            self.count += 1
            row, work = _collective.start_all_to_all(fingerprint, self.group, self.world_size)
        if not _collective.wait_for(work, _FIRST_WAIT):
            self._wait_long(work, point)
        fingerprints: list[int] = row.tolist()
        return min(fingerprints) == max(fingerprints)

    def require(self, point: Point, position: int = 0, label: str = "") -> None:
        """Check ``point``; if the ranks differ, raise the same error, naming every rank's point, on every rank.

        Args:
            point: what this rank is about to do.
            position: where in the run it does it (the batch number of a step value), part of what must agree.
            label: ``position`` for people (``"batch 12"``), added to the point's description on the error path.

        """
        if not self.agree(point, position):
            mine = dataclasses.replace(point, where=f"{point.where} at {label}", position=position) if label else point
            self.fail_jointly(describe_divergence(self.gather(mine)))

    def gather(self, point: Point) -> list[Point]:
        """Every rank's point (after a check that found them different: every rank calls this then)."""
        points: list[Point] = _collective.gather_objects_in(point, self.group, self.world_size)
        return points

    def fail_jointly(self, error: errors.CrossRankError) -> NoReturn:
        """Raise ``error``, which every rank raises at this same point (nothing to unblock)."""
        self._before_error()
        raise mark_joint(error)

    def fail_alone(self, error: BaseException) -> NoReturn:
        """Report ``error`` to every rank (their watchdogs release them), then raise it here."""
        self._before_error()
        record = self.watchdog.post(record_of(error, self.rank, joint=False))
        raise_record(record, cause=error)

    def complete_pending(self) -> None:
        """The run is failing: join the checks other ranks still wait in, so no rank is left with a pending one.

        Called by the watchdog thread. A pending collective on a group would block that group's destruction when the
        process exits; the fillers pair with the pending checks (their values are never read).
        """
        target = self.watchdog.pending_checks()
        with self._lock:
            while self.count < target:
                self.count += 1
                self._fillers.append(_collective.start_all_to_all(0, self.group, self.world_size))

    def _wait_long(self, work: Any, point: Point) -> None:
        self.watchdog.check = (self.count, point.where)
        self.watchdog.publish_pending(self.count)
        try:
            seen: dict[int, Location] = {}
            wait = _NEXT_WAIT
            while True:
                posted = self.watchdog.posted()
                if posted is not None:
                    self._before_error()
                    self.watchdog.request_completion()  # our check is pending: have the others join it
                    raise_record(posted)
                if self.watchdog.claim(f"diagnose/{self.count}/{point.fingerprint}"):
                    seen = self._diagnose(point, seen)
                try:
                    if _collective.wait_for(work, wait):
                        return
                except RuntimeError as failure:  # a peer's process ended: it posted why
                    posted = self.watchdog.read_posted()
                    self._before_error()
                    if posted is None:
                        raise
                    raise_record(posted, cause=failure)
                wait = min(2 * wait, _MAX_WAIT)
        finally:
            self.watchdog.check = None

    def _diagnose(self, point: Point, seen: dict[int, Location]) -> dict[int, Location]:
        """Look where the other ranks are; raise if every missing rank is stuck elsewhere (a deadlock)."""
        others = [rank for rank in range(self.world_size) if rank != self.rank]
        locations = self.watchdog.locate(others)
        missing = [loc for loc in locations.values() if loc.check is None or loc.check[0] != self.count]
        stuck = [
            loc
            for loc in missing
            if loc.blocked_in is not None and loc.rank in seen and seen[loc.rank].signature == loc.signature
        ]
        if missing and len(stuck) == len(missing) and len(locations) == len(others):
            self.fail_alone(describe_deadlock(point, self.rank, stuck))
        return locations


def record_of(error: BaseException, rank: int, *, joint: bool) -> ErrorRecord:
    """The board entry for ``error`` raised on ``rank``."""
    if isinstance(error, errors.CrossRankError):
        return ErrorRecord(type(error).__name__, str(error), rank, joint)
    text = "".join(traceback.format_exception(error)).rstrip()
    message = f"Rank {rank} failed with {type(error).__name__}: {error}\n--- rank {rank} traceback ---\n{text}"
    return ErrorRecord("RankFailedError", message, rank, joint)


def raise_record(record: ErrorRecord, cause: BaseException | None = None) -> NoReturn:
    """Raise the error a board entry describes (same class, same message, on whichever rank reads it)."""
    cls = getattr(errors, record.cls, errors.RankFailedError)
    raise mark_joint(cls(record.message)) from cause
