"""The live straggler check: rank 0 judges every rank's latest telemetry rows, through the watchdogs' mailboxes.

No collective is added and no rank's training thread waits for another's (how: :class:`StragglerWatch`).
"""

import math
import queue
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol

from lightning_ext._collective import STORE_ERRORS
from lightning_ext._telemetry.telemetry import Telemetry, WindowRow
from lightning_ext.errors import StragglerWarning

__all__ = ["ANSWER_WAIT", "CHECK", "CHECK_EVERY_S", "WINDOW", "Mailbox", "StragglerWatch", "warning_text"]

WINDOW = "straggler_window"  # the request every rank's watchdog answers with its latest telemetry rows
CHECK = "straggler_check"  # the notice rank 0's training thread mails its own watchdog: judge the ranks' rows now
ANSWER_WAIT = 2.0  # seconds the other ranks' watchdogs get to answer (a rank that does not is left out)
CHECK_EVERY_S = 30.0  # after a check, the next starts this many seconds later at the soonest, whatever the row rate


class Mailbox(Protocol):
    """What the check needs of a rank's watchdog (``lightning_ext._watch.watchdog.Watchdog``)."""

    @property
    def answers(self) -> dict[str, Callable[[], object]]:  # requests this rank answers, by kind
        ...

    @property
    def handlers(self) -> dict[str, Callable[[dict[str, str]], None]]:  # notices its thread serves, by kind
        ...

    def notify(self, rank: int, kind: str, **fields: str) -> None:  # mail a notice to a rank's watchdog
        ...

    def ask_in_thread(self, ranks: list[int], kind: str, timeout: float) -> dict[int, Any]:  # from its own thread
        ...


class StragglerWatch:
    """The live straggler check of one rank during a fit: every rank answers, rank 0 judges and warns.

    Every rank's watchdog answers the request :data:`WINDOW` with its latest telemetry rows (``Telemetry.window``).
    Every ``rows`` telemetry rows (and :data:`CHECK_EVERY_S` at the soonest after the last check), rank 0's training
    thread mails its own watchdog the notice :data:`CHECK`; that
    thread asks the other ranks' watchdogs for their rows (the watchdog's request/reply protocol), runs the straggler
    verdict on them and leaves the warning, if one is due, for the training thread, which gives it at its next row (so
    that the warning filters in force in training apply to it).

    Args:
        telemetry: this rank's telemetry (its :attr:`~Telemetry.window` holds the rows judged).
        mailbox: this rank's watchdog.
        rank: this rank.
        world_size: the number of ranks.
        rows: rank 0 judges every this many of its telemetry rows (the window's length).
        reminder_s: a straggler already warned about is warned about again at most every this many seconds.
        log_dir: the run's log directory, named in the warning.

    """

    def __init__(
        self,
        telemetry: Telemetry,
        mailbox: Mailbox,
        rank: int,
        world_size: int,
        rows: int,
        reminder_s: float,
        log_dir: str,
    ) -> None:
        self._telemetry, self._mailbox, self._rank, self._world_size = telemetry, mailbox, rank, world_size
        self._rows, self._reminder_s, self._log_dir = rows, reminder_s, log_dir
        self._written = 0
        self._idle = threading.Event()  # rank 0: no check is under way on its watchdog's thread
        self._idle.set()
        self._checked_at = -math.inf  # rank 0: when the last check started (monotonic)
        self._warned: dict[int, float] = {}  # rank 0: when each straggler was last warned about (monotonic)
        self._warnings: queue.SimpleQueue[str] = queue.SimpleQueue()  # from the watchdog's thread to the training's
        mailbox.answers[WINDOW] = telemetry.window_rows
        if rank == 0:
            mailbox.handlers[CHECK] = self._check
            telemetry.row_written = self._row_written

    def stop(self) -> None:
        """Stop answering and judging (teardown); rank 0 gives the warning of a check still under way, if any."""
        self._mailbox.answers.pop(WINDOW, None)
        if self._rank == 0:
            self._idle.wait(ANSWER_WAIT + 3.0)  # the check's answers, then its verdict: a fit that ends meanwhile
            self._give_warnings()
        self._mailbox.handlers.pop(CHECK, None)

    def _row_written(self) -> None:
        """Rank 0's training thread, after each telemetry row: give a warning found meanwhile; start a check."""
        self._give_warnings()
        self._written += 1
        if self._written >= self._rows and self._idle.is_set() and time.monotonic() - self._checked_at >= CHECK_EVERY_S:
            self._written, self._checked_at = 0, time.monotonic()
            self._idle.clear()
            try:
                self._mailbox.notify(0, CHECK)
            except STORE_ERRORS:  # the store is gone (the run is ending): no check
                self._idle.set()

    def _give_warnings(self) -> None:
        while not self._warnings.empty():
            warnings.warn(self._warnings.get(), StragglerWarning, stacklevel=3)

    def _check(self, message: dict[str, str]) -> None:
        """Rank 0's watchdog thread: judge every rank's latest rows; queue a warning for each chronic straggler due."""
        try:
            others = list(range(1, self._world_size))
            windows: dict[int, list[WindowRow]] = self._mailbox.ask_in_thread(others, WINDOW, ANSWER_WAIT)
            windows[0] = self._telemetry.window_rows()
            for text in self.judge(windows, time.monotonic()):
                self._warnings.put(text)
        finally:
            self._idle.set()

    def judge(self, windows: dict[int, list[WindowRow]], now: float) -> list[str]:
        """The warnings due at ``now`` (monotonic seconds) for every rank's latest telemetry rows, by rank."""
        # no pandas: half a second of the interpreter to import, on this thread, would hold rank 0's training back and
        # make it the straggler that the check then names (the rule is numpy's; imported here, where telemetry is on)
        from lightning_ext._summaries.stragglers import stragglers, window_times

        if not any(windows.values()):
            return []
        due = []
        for record in (found for found in stragglers(window_times(windows)) if found.pattern == "chronic"):
            last = self._warned.get(record.rank)
            if last is None or now - last >= self._reminder_s:
                self._warned[record.rank] = now
                due.append(warning_text(record, self._log_dir, reminder=last is not None))
        return due


def warning_text(record: Any, log_dir: str, *, reminder: bool = False) -> str:
    """The warning for one chronic straggler of a window (a row of the verdict)."""
    from lightning_ext._summaries.number_format import duration, step_ranges

    again = "still " if reminder else ""
    return (
        f"Straggler: the other ranks are {again}waiting for rank {record.rank}. In {record.held} of the last"
        f" {record.rows} telemetry rows (steps {step_ranges(record.spans)}) it spent {duration(record.excess_s)} more"
        f" per batch than they did in {record.phase} ({duration(record.seconds)} against {duration(record.others_s)}),"
        f" and they lost {record.cost:.0%} of their step time waiting for it. After the run,"
        f" `lightning-ext ranks {log_dir} --stragglers` gives the verdict of the whole run."
    )


def start_telemetry(
    logger: Any, trainer: Any, options: Any, rank: int, world_size: int, cuda_device: Any, mailbox: Any, log_dir: Any
) -> Telemetry:
    """Start ``trainer``'s telemetry on this rank (``options``: its :class:`~lightning_ext.PerRankMetrics`), with the
    live straggler check where the options ask for it and the rank has a watchdog (``mailbox``); detaching the
    telemetry stops the check."""
    window = options.straggler_window or 0
    telemetry = Telemetry(logger, rank, options.telemetry_every_n_steps, cuda_device, window)
    telemetry.attach(trainer)
    if window and mailbox is not None and log_dir is not None:
        reminder = options.straggler_reminder_minutes * 60
        watch = StragglerWatch(telemetry, mailbox, rank, world_size, window, reminder, log_dir)
        telemetry.detaching = watch.stop
    return telemetry
