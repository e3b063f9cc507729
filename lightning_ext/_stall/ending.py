"""Ending a stalled run on every rank: the interrupt of a training thread, and the end of a process that cannot act."""

import contextlib
import ctypes
import multiprocessing
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from lightning_ext._files.storage import guarded
from lightning_ext._stall.rank_report import launched, liveness
from lightning_ext._watch.facts import Recorder
from lightning_ext._watch.watchdog import ErrorRecord

__all__ = ["StallEnding", "StallInterrupt", "defer_child_observer", "disarm_child_observer", "restore_child_observer"]

_REACT = 1.0  # seconds a rank gets to raise the posted error by itself (at a check) before it is interrupted
_GRACE_BEHIND = 2.0  # seconds a rank named as behind gets, once interrupted, before its process is ended
_GRACE_POLLING = 7.0  # the same, while it waits for its DataLoader workers (their queue is polled every 5 s)
_GRACE = 10.0  # the other ranks, once the ranks behind have ended (gloo releases their collectives then)
_LONGEST = 60.0  # seconds a rank waits at most for the ranks behind to end before it ends
_OBSERVER_GRACE = 20.0  # seconds Lightning's child observer waits before its kill, so a dead child is reported first


class StallInterrupt(BaseException):
    """Raised in a training thread that runs Python code once the run has stalled; it becomes the ``StallError``.

    A ``BaseException``, so that no handler of ``Exception`` on the way swallows it.
    """


class StallEnding:
    """How this rank ends once a stall has been established (``on_stall="error"``).

    Args:
        recorder: this rank's facts (its training thread, its trainer).
        processes: every rank's ``(pid, host)``, in rank order.
        flush: writes this rank's buffered per-rank rows.
        ended: set when the run has ended by itself (teardown): nothing is left to do.

    """

    def __init__(
        self, recorder: Recorder, processes: list[tuple[int, str]], flush: Callable[[], None], ended: threading.Event
    ) -> None:
        self.recorder, self.processes, self._flush, self._ended = recorder, processes, flush, ended
        self.host = socket.gethostname()
        self.failing = False  # set when this rank's training thread handles an error
        self._lock = threading.Lock()  # no interrupt is sent once the training thread handles an error

    def handled(self) -> None:
        """The training thread handles an error: no interrupt from now on, and none left pending (training thread)."""
        with self._lock:
            self.failing = True
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.recorder.thread), None)

    def begin(self, record: ErrorRecord) -> None:
        """End this rank with ``record`` (the posted ``StallError``): in a thread of its own, as described below."""
        disarm_child_observer()
        name = f"lightning-ext-stall-end-{self.recorder.rank}"
        threading.Thread(target=self._end_here, args=(record,), name=name, daemon=True).start()

    def alive(self, rank: int) -> bool:
        """Whether ``rank``'s process may still live (``True`` where this process cannot tell)."""
        pid, host = self.processes[rank]
        return liveness(pid, host, self.host, launched(self.recorder.trainer)).alive is not False

    def _end_here(self, record: ErrorRecord) -> None:
        """Interrupt the training thread if it runs Python code; end the process if it cannot act at all.

        A rank named as behind goes first: its DataLoader workers are ended (they may be what is stuck, and a stuck
        worker would hold its exit), its training thread is interrupted, and its process ends if the thread is inside
        C/C++ code. The other ranks are released when the ranks behind end (gloo fails their collective; NCCL ones
        were aborted already), so they wait for that before ending themselves.
        """
        if self._ended.wait(_REACT):
            return
        behind = self.recorder.rank in record.ranks
        if behind:
            _end_children()
        with self._lock:
            if self.failing:
                return
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self.recorder.thread), ctypes.py_object(StallInterrupt)
            )
        if behind:
            frame = sys._current_frames().get(self.recorder.thread)
            polling = any(one.f_code.co_name == "_get_data" for one in _outwards(frame))
            self._end_after(record, _GRACE_POLLING if polling else _GRACE_BEHIND, [])
        else:
            self._end_after(record, _GRACE, [rank for rank in record.ranks if rank != self.recorder.rank])

    def _end_after(self, record: ErrorRecord, seconds: float, wait_for: list[int]) -> None:
        """End this process after ``seconds`` (counted from when the ranks in ``wait_for`` are gone, where this
        process can tell; at most :data:`_LONGEST`) unless the run ends first."""
        started = time.monotonic()
        deadline = started + seconds
        while time.monotonic() < min(deadline, started + _LONGEST):
            if self._ended.wait(0.2) or self.failing:
                return
            if any(self.alive(rank) for rank in wait_for):
                deadline = time.monotonic() + seconds
        with guarded():  # the rows kept so far, if they can be: this process ends now in any case
            self._flush()
        _end_children()
        print(
            f"lightning-ext: rank {self.recorder.rank}'s training thread cannot be interrupted (it is inside a C/C++"
            f" call), so its process ends now.\nStallError: {record.message}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)


def defer_child_observer() -> None:
    """Have Lightning's default launcher wait a little before it kills rank 0 because a child rank ended.

    Its ``_ChildProcessObserver`` thread (in rank 0's process) SIGKILLs rank 0 and every child within 5 s of one child
    exiting non-zero. A child killed by ``SIGKILL`` fails rank 0's collective at once (gloo) and the stall report names
    it: that takes a few seconds, which the observer now waits (:data:`_OBSERVER_GRACE`) before its kill, which then
    comes only if rank 0 has not ended by itself. Elsewhere (no such thread) this does nothing.
    """
    for thread in _observers():
        if not isinstance(vars(thread).get("_terminate_all"), _Deferred):
            vars(thread)["_terminate_all"] = _Deferred(thread._terminate_all)


def disarm_child_observer() -> None:
    """Switch the observer's kill off for the rest of the run: a stall is established, and lightning-ext ends every
    rank itself (a child that exits first must not cut rank 0 short of its report and its error)."""
    for thread in _observers():
        deferred = vars(thread).get("_terminate_all")
        if isinstance(deferred, _Deferred):
            deferred.disarmed = True
        else:
            vars(thread)["_terminate_all"] = _nothing


def restore_child_observer() -> None:
    """Give the observer its own kill back (teardown of a run without a stall)."""
    for thread in _observers():
        deferred = vars(thread).get("_terminate_all")
        if isinstance(deferred, _Deferred) and not deferred.disarmed:
            del vars(thread)["_terminate_all"]


class _Deferred:
    """The observer's kill, after :data:`_OBSERVER_GRACE` seconds, unless disarmed meanwhile (the observer's thread)."""

    def __init__(self, terminate: Callable[[], None]) -> None:
        self.terminate, self.disarmed = terminate, False

    def __call__(self) -> None:
        time.sleep(_OBSERVER_GRACE)
        if not self.disarmed:
            self.terminate()


def _observers() -> list[Any]:
    return [thread for thread in threading.enumerate() if type(thread).__name__ == "_ChildProcessObserver"]


def _nothing() -> None:
    return None


def _outwards(frame: FrameType | None) -> list[FrameType]:
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _end_children() -> None:
    """End this process's multiprocessing children (its DataLoader workers), which would outlive an ``os._exit``."""
    # the set of children changes meanwhile (RuntimeError), a child is gone or closed (OSError, ValueError)
    with contextlib.suppress(RuntimeError, OSError, ValueError):
        for child in multiprocessing.active_children():
            with contextlib.suppress(OSError, ValueError):
                child.kill()
