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

from lightning_ext._hang.facts import Recorder
from lightning_ext._hang.stall_facts import launched, liveness
from lightning_ext._hang.watchdog import ErrorRecord

__all__ = ["StallEnding", "StallInterrupt", "disarm_child_observer"]

_REACT = 1.0  # seconds a rank gets to raise the posted error by itself (at a check) before it is interrupted
_GRACE_BEHIND = 2.0  # seconds a rank named as behind gets, once interrupted, before its process is ended
_GRACE_POLLING = 7.0  # the same, while it waits for its DataLoader workers (their queue is polled every 5 s)
_GRACE = 10.0  # the other ranks, once the ranks behind have ended (gloo releases their collectives then)
_LONGEST = 60.0  # seconds a rank waits at most for the ranks behind to end before it ends


class StallInterrupt(BaseException):
    """Raised in a training thread that runs Python code once the run has stalled; it becomes the ``StallError``.

    A ``BaseException``, so that no ``except Exception`` on the way swallows it.
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
        with contextlib.suppress(Exception):
            self._flush()
        _end_children()
        print(
            f"lightning-ext: rank {self.recorder.rank}'s training thread cannot be interrupted (it is inside a C/C++"
            f" call), so its process ends now.\nStallError: {record.message}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)


def disarm_child_observer() -> None:
    """Keep Lightning's default launcher from killing rank 0 while every rank ends with the stall's error.

    Its ``_ChildProcessObserver`` thread (in rank 0's process) SIGKILLs rank 0 and every child as soon as one child
    exits non-zero, so a child that exits first would cut rank 0 short of its report and its error. Once a stall is
    established lightning-ext ends every rank itself, so the observer's kill is switched off for the rest of the run.
    Elsewhere (no such thread) this does nothing.
    """
    for thread in threading.enumerate():
        if type(thread).__name__ == "_ChildProcessObserver":
            thread.__dict__["_terminate_all"] = _nothing


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
    with contextlib.suppress(Exception):
        for child in multiprocessing.active_children():
            with contextlib.suppress(Exception):
                child.kill()
