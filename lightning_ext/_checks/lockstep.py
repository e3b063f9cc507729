"""Lockstep: every rank must pass the same checks in the same order; the first difference is an error."""

import dataclasses
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import NoReturn

from lightning_ext import _collective, errors
from lightning_ext._checks.messages import describe_deadlock, describe_divergence, signalled_message
from lightning_ext._checks.points import Label, Point, fingerprint_at, labelled
from lightning_ext._checks.verdict import diagnosed
from lightning_ext._watch.facts import Recorder
from lightning_ext._watch.watchdog import ErrorRecord, Watchdog, raise_record
from lightning_ext.errors import mark_joint

__all__ = ["Lockstep", "record_of"]

_FIRST_WAIT = 2.0  # seconds before a waiting rank first asks the others for their facts
_NEXT_WAIT = 1.0  # then between two looks, doubling up to _MAX_WAIT (only when to look: no verdict depends on it)
_MAX_WAIT = 30.0


def _nothing() -> None:
    return None


def _ignore_signal(name: str, text: str) -> None:
    return None


class Lockstep:
    """The checks of one rank in one run (a no-op at world size 1).

    Args:
        channel: this rank's links for the checks.
        watchdog: this rank's watchdog (its recorder holds this rank's facts).
        before_error: called before this rank raises any error here (flushes per-rank files).

    """

    def __init__(self, channel: _collective.CheckChannel, watchdog: Watchdog, before_error: Callable[[], None]) -> None:
        self.channel = channel
        self.watchdog = watchdog
        self.recorder: Recorder = watchdog.recorder
        self.rank = watchdog.rank
        self.world_size = watchdog.world_size
        self.count = 0  # checks started by this rank (including those its watchdog completes for it)
        self._before_error = before_error
        self._lock = threading.Lock()
        # set by the owner: around each exchange, where this rank waits for the others (per-rank telemetry times it)
        self.waiting: Callable[[], AbstractContextManager[None]] = nullcontext
        watchdog.on_error = self.complete_pending

    def agree(self, point: Point, position: int = 0, label: Label = "") -> bool:
        """Whether every rank is at the same point (and ``position``, e.g. the batch). Raises a posted error.

        ``label`` says ``position`` for people, on the error paths only (a string, or a function that returns one).
        """
        posted = self.watchdog.posted()
        if posted is not None:
            self._before_error()
            raise_record(posted)
        recorder = self.recorder
        fingerprint = fingerprint_at(point.fingerprint, position, recorder.total())
        with self.waiting():
            with self._lock:
                self.count += 1
                exchange = self.channel.start(fingerprint)
            recorder.check_since = time.monotonic()
            recorder.check = (self.count, point.where)
            try:
                if not exchange.wait(_FIRST_WAIT):
                    self._wait_long(exchange, point, label)
                recorder.checks = self.count
            finally:
                recorder.check = None
        # A check that disagrees, or that another rank's watchdog completed (its fillers carry no point), comes of a
        # failing run whose error was posted before any filler ran; this rank's own watchdog may not have read it yet,
        # so the store is asked. Taken for a divergence, it would wait in `gather` for ranks that never come.
        posted = self.watchdog.posted() if exchange.agreed and not exchange.filled else self.watchdog.read_posted()
        if posted is not None:  # the check was completed by other ranks' watchdogs: the run is failing
            self._before_error()
            raise_record(posted)
        return exchange.agreed

    def require(self, point: Point, position: int = 0, label: Label = "") -> None:
        """Check ``point``; if the ranks differ, raise the same error, naming every rank's point, on every rank.

        Args:
            point: what this rank is about to do.
            position: where in the run it does it (the batch number of a step value), part of what must agree.
            label: ``position`` for people (``"batch_idx 3 of training"``), added to the point's description on the
                error paths; a function is called only there.

        """
        if not self.agree(point, position, label):
            self.fail_jointly(describe_divergence(self.gather(labelled(point, position, label))))

    def gather(self, point: Point) -> list[Point]:
        """Every rank's point, with its facts (after a check that found them different: every rank calls this then).

        The points travel through the store, not a collective: this is the error path, and it runs once per check.
        """
        mine = dataclasses.replace(point, facts=self.recorder.snapshot())
        key = f"gather/{self.count}"
        points: list[Point] = _collective.gather_in_store(self.watchdog.store, key, mine, self.world_size, self.rank)
        return points

    def fail_jointly(self, error: errors.CrossRankError) -> NoReturn:
        """Raise ``error``, which every rank raises at this same point (nothing to unblock)."""
        self._before_error()
        raise mark_joint(error)

    def fail_alone(self, error: BaseException) -> NoReturn:
        """Report ``error`` to every rank (their watchdogs release them), then raise it here."""
        self._before_error()
        record = self.watchdog.post(record_of(error, self.rank, joint=False, recorder=self.recorder))
        raise_record(record, cause=error)

    def close(self) -> None:
        """Release the checks' links now, on every rank alike (the watchdog is stopped): no reference cycle keeps
        them, and their gloo groups, until the garbage collector runs at some other time on each rank."""
        self.watchdog.on_error = _nothing
        self.recorder.on_signal = _ignore_signal
        self.channel.close()

    def complete_pending(self) -> None:
        """The run is failing: join the checks other ranks still wait in, so no rank is left with a pending one.

        Called by the watchdog thread. A pending collective on a group would block that group's destruction when the
        process exits; the fillers pair with the pending checks, whose ranks then read the posted error.
        """
        target = self.watchdog.pending_checks()
        with self._lock:
            while self.count < target:
                self.count += 1
                self.channel.fill()

    def _wait_long(self, exchange: _collective.CheckExchange, point: Point, label: Label) -> None:
        self.watchdog.publish_pending(self.count)
        wait = _NEXT_WAIT
        while True:
            posted = self.watchdog.posted()
            if posted is not None:
                exchange.abandon()
                self._before_error()
                self.watchdog.request_completion()  # our check is pending: have the others join it
                raise_record(posted)
            if self.watchdog.claim(f"diagnose/{self.count}/{point.fingerprint}"):
                self._diagnose(labelled(point, 0, label), exchange)
            try:
                if exchange.wait(wait):
                    return
            except RuntimeError as failure:  # a peer's process ended: it posted why
                posted = self.watchdog.read_posted()
                self._before_error()
                if posted is None:
                    raise
                raise_record(posted, cause=failure)
            wait = min(2 * wait, _MAX_WAIT)

    def _diagnose(self, point: Point, exchange: _collective.CheckExchange) -> None:
        """Ask every rank for its facts; raise if they prove that the missing ranks cannot come (a deadlock)."""
        others = self.watchdog.facts_of([rank for rank in range(self.world_size) if rank != self.rank])
        found = diagnosed(self.recorder.snapshot(), others, self.world_size)
        if found is not None and not exchange.wait(0):  # and this rank's own check has not completed meanwhile
            self.fail_alone(describe_deadlock(point, *found))


def record_of(error: BaseException, rank: int, *, joint: bool, recorder: Recorder | None = None) -> ErrorRecord:
    """The board entry for ``error`` raised on ``rank`` (a signal that rank received is named as the cause)."""
    if isinstance(error, errors.CrossRankError):
        return ErrorRecord(type(error).__name__, str(error), rank, joint)
    if recorder is not None and recorder.signal is not None:
        return ErrorRecord("RankSignalledError", signalled_message(rank, recorder.signal, error), rank, joint)
    text = "".join(traceback.format_exception(error)).rstrip()
    message = f"Rank {rank} failed with {type(error).__name__}: {error}\n--- rank {rank} traceback ---\n{text}"
    return ErrorRecord("RankFailedError", message, rank, joint)
