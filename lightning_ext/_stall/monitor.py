"""The stall monitor: a per-rank thread that notices a stalled group, writes the report and ends the run."""

import contextlib
import datetime
import os
import re
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from lightning_ext import _collective
from lightning_ext._files.storage import guarded
from lightning_ext._stall.causes import Thresholds, is_stalled, report_text, summarize, thresholds
from lightning_ext._stall.ending import (
    StallEnding,
    StallInterrupt,
    defer_child_observer,
    restore_child_observer,
)
from lightning_ext._stall.rank_report import RankReport, checkpoint_work, collect, launched, liveness, progress_marks
from lightning_ext._watch.facts import Recorder
from lightning_ext._watch.watchdog import ANSWER_TIMEOUT, ErrorRecord, Watchdog, ask
from lightning_ext.errors import is_joint

__all__ = ["Introduction", "OnStall", "StallMonitor", "StallOptions", "introduction", "start"]

OnStall = Literal["error", "report"]
REPORT_NAME = "stall_report.txt"
_LOCAL_ANSWER_TIMEOUT = 2.0  # seconds a rank on this host whose process exists gets to answer (else ANSWER_TIMEOUT)
_VERDICT_WAIT = 20.0  # seconds a rank whose collective failed waits for the reporting rank's verdict


@dataclass(frozen=True)
class StallOptions:
    """The stall report's options (validated here, at the strategy's construction).

    Attributes:
        stall_timeout: seconds, ``"auto"`` (shortly before the process group's timeout) or ``None`` (off).
        on_stall: ``"error"`` (report, then end the run on every rank) or ``"report"`` (report, keep waiting).

    Raises:
        TypeError: ``stall_timeout`` is not a number, ``"auto"`` or ``None``.
        ValueError: ``stall_timeout`` is not positive, or ``on_stall`` is not one of its values.

    """

    stall_timeout: float | str | None = "auto"
    on_stall: OnStall = "error"

    def __post_init__(self) -> None:
        timeout = self.stall_timeout
        if timeout is not None and timeout != "auto":
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"stall_timeout must be a number of seconds, 'auto' or None, got {timeout!r}")
            if not timeout > 0:
                raise ValueError(f"stall_timeout must be more than 0 seconds, got {timeout!r}")
        if self.on_stall not in ("error", "report"):
            raise ValueError(f"on_stall must be 'error' or 'report', got {self.on_stall!r}")


class Introduction(NamedTuple):
    """What a rank tells the others at set-up: its pid and host (to tell whether it lives), and the log dir."""

    pid: int
    host: str
    log_dir: str | None  # rank 0's is where the report goes


def introduction(log_dir: str | None) -> Introduction:
    """This rank's :class:`Introduction`."""
    return Introduction(os.getpid(), socket.gethostname(), log_dir)


def start(
    options: StallOptions,
    recorder: Recorder,
    watchdog: Watchdog,
    namespace: str,
    peers: list[Introduction],
    flush: Callable[[], None],
) -> "StallMonitor | None":
    """This rank's monitor, or ``None`` when the stall report is off (``peers``: every rank's :func:`introduction`)."""
    if options.stall_timeout is None or not peers:
        return None
    limits = thresholds(options.stall_timeout, _collective.training_timeout())
    processes = [(peer.pid, peer.host) for peer in peers]
    monitor = StallMonitor(recorder, watchdog, limits, options.on_stall, namespace, peers[0].log_dir, processes, flush)
    checkpoint_work(recorder.trainer, recorder)
    defer_child_observer()
    return monitor


class StallMonitor:
    """The stall monitor of this rank.

    Args:
        recorder: this rank's facts.
        watchdog: this rank's watchdog (it answers the other ranks' inquiries and delivers the error).
        thresholds: when to report, when to end.
        on_stall: ``"error"`` (report, then end the run on every rank) or ``"report"``.
        namespace: the run's store namespace.
        log_dir: where the report goes (the run's log directory, rank 0's).
        processes: every rank's ``(pid, host)``, in rank order.
        flush: writes this rank's buffered per-rank rows.

    """

    def __init__(
        self,
        recorder: Recorder,
        watchdog: Watchdog,
        thresholds: Thresholds,
        on_stall: OnStall,
        namespace: str,
        log_dir: str | None,
        processes: list[tuple[int, str]],
        flush: Callable[[], None],
    ) -> None:
        self.recorder, self.watchdog, self.thresholds, self.on_stall = recorder, watchdog, thresholds, on_stall
        self.rank, self.world_size = recorder.rank, recorder.world_size
        self.log_dir, self.processes = log_dir, processes
        self.host = socket.gethostname()
        self.period = min(30.0, max(0.25, thresholds.report_after / 10))
        self.record: ErrorRecord | None = None  # the stall error, once this rank knows it
        self._store = _collective.store_client(namespace)  # the monitor thread's own connection
        self._marks: tuple[Any, ...] = ()
        self._changed = time.monotonic()
        self._reported: tuple[float, str] | None = None  # (when, report path) of a stall this rank reported
        self._summary, self._behind = "", list[int]()
        self._ended = threading.Event()
        self.ending = StallEnding(recorder, processes, flush, self._ended)
        self._lock = threading.Lock()
        self._inquiry = threading.Lock()  # the monitor thread and a failing training thread may both inquire
        watchdog.answers["stall"] = self._answer
        self._thread = threading.Thread(target=self._run, name=f"lightning-ext-stall-{self.rank}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread, let go of the watchdog and of the checkpoint methods (teardown)."""
        self._ended.set()
        self.watchdog.answers.pop("stall", None)
        checkpoint_work(self.recorder.trainer, None)
        restore_child_observer()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        if self._reported is not None and self.record is None:  # the run ended soon after a report it outlived
            with guarded():  # a diagnostic never stands in the way of teardown
                self._follow_up(self.since_progress())

    def idle_clients(self) -> list[Any]:
        """Its own store client, once its thread has ended (for reuse by a later run: ``release_store_clients``)."""
        return [] if self._thread.is_alive() else [self._store]

    def since_progress(self) -> float:
        """Seconds since this rank's progress counters last moved (0 while it writes or loads a checkpoint)."""
        with self._lock:
            now = time.monotonic()
            marks = progress_marks(self.recorder)
            if marks != self._marks or self.recorder.is_busy():
                self._marks, self._changed = marks, now
            return now - self._changed

    def on_failure(self, error: BaseException) -> ErrorRecord | None:
        """This rank's run raised ``error`` (its training thread): the stall error to raise instead, if any.

        Whatever a rank raises once a stall is established is a consequence of it. A collective that failed with no
        stall known means that a peer's process ended: that is a stall at once, reported now.
        """
        self.ending.handled()
        if is_joint(error):
            return None
        try:
            posted = self.watchdog.read_posted()
        except _collective.STORE_ERRORS:  # the store is gone with the process that held it: what the watchdog saw
            posted = self.watchdog.posted()
        if posted is not None and posted.cls == "StallError":
            return posted
        if self.record is not None:
            return self.record
        if isinstance(error, StallInterrupt) or _collective.is_communication_failure(error):
            if posted is not None and posted.rank != self.rank:  # another rank's error ended its process: that one
                return None
            with guarded() as failure:  # a diagnostic steps aside: the run ends with its own error
                return self.inquire(failure=error)
            warnings.warn(f"lightning-ext's stall report failed: {failure.error!r}", RuntimeWarning, stacklevel=1)
        return None

    # ---- the thread ----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._ended.wait(self.period):
            with guarded() as failure:  # a diagnostic never ends a run: warn, and stop watching
                self._tick()
            if failure.error is not None:
                message = f"lightning-ext's stall monitor stopped on rank {self.rank}: {failure.error!r}"
                warnings.warn(message, RuntimeWarning, stacklevel=1)
                return

    def _tick(self) -> None:
        if self.record is not None or self.ending.failing:  # the run is ending
            return
        quiet = self.since_progress()
        if self._reported is not None:
            self._follow_up(quiet)
            return
        wait = self.recorder.waiting()
        report_after = self.thresholds.report_after
        if wait is not None and time.monotonic() - wait[1] >= report_after and quiet >= report_after:
            self.inquire()

    def _follow_up(self, quiet: float) -> None:
        """After a report that did not end the run: say so when the run moves again (this rank progressed)."""
        since, path = self._reported or (0.0, "")
        if quiet < time.monotonic() - since:
            waited = time.monotonic() - since + self.thresholds.report_after
            note = f"lightning-ext: the stall reported in {path} resolved itself after {waited:.0f} s: training goes on"
            print(note, file=sys.stderr, flush=True)
            _append(path, note + "\n")
            self._reported = None
            self._store.add("stall/episode", 1)

    # ---- an inquiry: claim, gather, decide, report ----------------------------------------------------------------
    def inquire(self, failure: BaseException | None = None) -> ErrorRecord | None:
        """Look at every rank; if the group has stalled (or ``failure`` shows a peer is gone), report and maybe end.

        Returns the stall's error record when the run ends with it.
        """
        with self._inquiry:
            return self._inquire(failure)

    def _inquire(self, failure: BaseException | None) -> ErrorRecord | None:
        if failure is not None and self._reported is not None:  # the stall this rank reported ends the run now
            path = self._reported[1]
            _append(path, f"The run ended when rank {self.rank}'s collective failed: {_first_line(failure)}\n")
            return self._end(self._summary, path, self._behind)
        try:
            episode = int(self._store.add("stall/episode", 0))
            if not self._claim(episode):
                return None if failure is None else self._verdict()
            everyone = self._gather()
        except _collective.STORE_ERRORS:  # the store is gone (it lived in a process that ended): report what it knows
            return self._report_alone(failure)
        if failure is None and not is_stalled(everyone, self.thresholds.report_after):
            self._store.add("stall/episode", 1)
            return None
        failed = {} if failure is None else {self.rank: _first_line(failure)}
        summary, behind = summarize(everyone, failed)
        path = self._write(everyone, summary, failure)
        self._summary, self._behind = summary, behind
        self._reported = (time.monotonic(), path)
        # a failed collective ends the run anyway: with the stall's error, in either mode
        if failure is not None or (self.on_stall == "error" and self.thresholds.ends):
            return self._end(summary, path, behind)
        return None

    def _claim(self, episode: int) -> bool:
        """Whether this rank reports this episode (one rank does); a claim of a rank whose process is gone is taken."""
        winner = int(self._store.compare_set(f"stall/claim/{episode}", "", str(self.rank)).decode())
        if winner == self.rank:
            return True
        pid, host = self.processes[winner]
        if liveness(pid, host, self.host, launched(self.recorder.trainer)).alive is False:
            self._store.compare_set("stall/episode", str(episode), str(episode + 1))
            return self._claim(int(self._store.add("stall/episode", 0)))
        return False

    def _verdict(self) -> ErrorRecord | None:
        """The error another rank's inquiry posts (this rank's collective failed too), or ``None`` if none comes."""
        with contextlib.suppress(*_collective.STORE_ERRORS):  # none came in time, or the store is gone
            self._store.wait(["error"], datetime.timedelta(seconds=_VERDICT_WAIT))
        with contextlib.suppress(*_collective.STORE_ERRORS):
            return self.watchdog.read_posted()
        return None

    def _gather(self) -> list[RankReport]:
        """Every rank's report: asked of the ranks that may live, said for the ranks known to be gone."""
        children = launched(self.recorder.trainer)
        reports = {self.rank: collect(self.recorder, self.since_progress(), self.host)}
        asked, local = [], True
        for rank, (pid, host) in enumerate(self.processes):
            if rank == self.rank:
                continue
            state = liveness(pid, host, self.host, children)
            if state.alive is False:
                reports[rank] = RankReport(rank, "exited", state.detail, pid, host)
            else:
                asked.append(rank)
                local = local and state.alive is True
        timeout = _LOCAL_ANSWER_TIMEOUT if local else ANSWER_TIMEOUT
        answers = ask(self._store, asked, "stall", timeout)
        for rank in asked:
            if rank in answers:
                reports[rank] = answers[rank]
                continue
            pid, host = self.processes[rank]
            # asked while it was ending (a SIGKILL closes its sockets before its process is gone): look again
            state = liveness(pid, host, self.host, children)
            if state.alive is False:
                reports[rank] = RankReport(rank, "exited", state.detail, pid, host)
            else:
                reports[rank] = RankReport(rank, "silent", f"no answer in {timeout:g} s", pid, host)
        return [reports[rank] for rank in sorted(reports)]

    def _answer(self) -> RankReport:
        """This rank's report, for another rank's inquiry (run by this rank's watchdog thread)."""
        return collect(self.recorder, self.since_progress(), self.host)

    def _write(self, everyone: list[RankReport], summary: str, failure: BaseException | None) -> str:
        limits = self.thresholds
        header = [
            f"lightning-ext stall report, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M:%S %Z}, written by rank"
            f" {self.rank} of {self.world_size}",
            f"Threshold: {limits.origin}; on_stall={self.on_stall!r}; process group timeout: {limits.group:g} s",
        ]
        if failure is not None:
            header.append(f"Seen when rank {self.rank}'s collective failed: {_first_line(failure)}")
        text = report_text(everyone, summary, header)
        path = os.path.join(self.log_dir or os.getcwd(), REPORT_NAME)
        print(text, file=sys.stderr, flush=True)
        _append(path, text)
        return path

    def _report_alone(self, failure: BaseException | None) -> ErrorRecord:
        """The store is gone with the process that held it: this rank reports what it knows, in a file of its own."""
        everyone = [collect(self.recorder, self.since_progress(), self.host)]
        children = launched(self.recorder.trainer)
        for rank, (pid, host) in enumerate(self.processes):
            if rank != self.rank:
                state = liveness(pid, host, self.host, children)
                detail = state.detail if state.alive is False else "not asked: the store does not answer"
                everyone.append(RankReport(rank, "exited" if state.alive is False else "silent", detail, pid, host))
        everyone.sort(key=lambda report: report.rank)
        summary, _ = summarize(everyone, {} if failure is None else {self.rank: _first_line(failure)})
        summary += (
            " The store does not answer: the process that held it ended (rank 0's under Lightning's default launcher,"
            " the first node's agent under torchrun)."
        )
        header = [f"lightning-ext stall report of rank {self.rank} alone", f"Threshold: {self.thresholds.origin}"]
        text = report_text(everyone, summary, header)
        path = os.path.join(self.log_dir or os.getcwd(), f"stall_report.rank{self.rank}.txt")
        print(text, file=sys.stderr, flush=True)
        _append(path, text)
        self.record = ErrorRecord("StallError", _message(summary, path), self.rank)
        return self.record

    # ---- ending the run ----------------------------------------------------------------------------------------------
    def _end(self, summary: str, path: str, behind: list[int]) -> ErrorRecord:
        record = ErrorRecord("StallError", _message(summary, path), self.rank, ranks=tuple(behind))
        self.record = self.watchdog.post(record)
        return self.record

    def on_error(self) -> None:
        """An error was posted (called by the watchdog thread): if it is a stall, make this rank end with it."""
        posted = self.watchdog.posted()
        if posted is None or posted.cls != "StallError" or self.ending.failing:
            return
        self.record = posted
        self.ending.begin(posted)


def _first_line(error: BaseException) -> str:
    """``RuntimeError: Read error [127.0.0.1]:33923: Connection reset by peer``: the error's first sentence, without
    the source location gloo puts first."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0]
    return f"{type(error).__name__}: {text[:160]}"


def _message(summary: str, path: str) -> str:
    return f"The ranks stalled: {summary}\nEvery rank's place, wait and stacks: {path}"


def _append(path: str, text: str) -> None:
    """Append ``text`` to the report file; a report that cannot be written warns (it is in the log already)."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a") as handle:
            handle.write(text)
    except OSError as error:
        message = f"lightning-ext could not write the stall report to {path}: {error}"
        warnings.warn(message, RuntimeWarning, stacklevel=1)
