"""A per-rank watchdog thread: it reports its rank's facts when asked, and delivers another rank's error."""

import atexit
import contextlib
import json
import pickle
import threading
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

from lightning_ext import _collective, errors
from lightning_ext._collective import STORE_ERRORS
from lightning_ext._watch.facts import Recorder
from lightning_ext._watch.rank_facts import Facts
from lightning_ext.errors import mark_joint

__all__ = ["ANSWER_TIMEOUT", "ErrorRecord", "Watchdog", "ask", "mail", "raise_record"]

ANSWER_TIMEOUT = 5.0  # seconds a rank's watchdog gets to answer a request (a rank on another host included)
_STOP_WAIT = timedelta(seconds=10)
_EXIT_WAIT = timedelta(seconds=2)
_IDLE_WAIT = timedelta(hours=24)  # the thread sleeps in the store until mail arrives; stop() sends mail


@dataclass(frozen=True)
class ErrorRecord:
    """An error as every rank will raise it.

    Attributes:
        cls: the name of a :mod:`lightning_ext.errors` class.
        message: the message, identical on every rank.
        rank: the rank that posted it.
        joint: whether every rank raised it together (no rank is blocked, so nothing needs unblocking).
        ranks: the ranks it names as the cause (a stall's ranks behind: they may not be able to act, so they end first).

    """

    cls: str
    message: str
    rank: int
    joint: bool = False
    ranks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(self.ranks))  # JSON brings a list back


class Watchdog:
    """The watchdog of this rank: location queries, the error board, and the thread that serves both.

    Args:
        namespace: the run's store namespace, identical on every rank.
        recorder: this rank's facts.

    """

    def __init__(self, namespace: str, recorder: Recorder) -> None:
        self.rank = recorder.rank
        self.world_size = recorder.world_size
        self.recorder = recorder
        # the training thread's quick operations go through the default group's connection (no connection of our own
        # to open, at set-up or at teardown); its waits, and the watchdog thread's, through connections of their own,
        # opened on first use, so that none blocks the other's store operations
        self._quick = _collective.default_store(namespace)
        self._store = _collective.store_client(namespace)  # the training thread's, for waits (asking, gathering)
        self._store.open_in_background()  # ready when an error needs it, without set-up waiting for it
        self._thread_store = _collective.store_client(namespace)  # the watchdog thread's, so it never blocks ours
        self._posted: ErrorRecord | None = None
        self.on_error: Callable[[], None] = _nothing  # set by the owner: what to do when an error is posted
        # set by owners: the other mail this thread serves, by type: notices (a stop request) ...
        self.handlers: dict[str, Callable[[dict[str, str]], None]] = {}
        # ... and requests, answered with what the function returns (see ask): this rank's facts, its stall report
        self.answers: dict[str, Callable[[], object]] = {"facts": recorder.snapshot}
        self._thread = threading.Thread(target=self._serve, name=f"lightning-ext-watchdog-{self.rank}", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def stop(self, wait: timedelta = _STOP_WAIT) -> None:
        """End the thread and wait for it.

        A daemon thread still inside a torch call when the interpreter exits aborts the process ("terminate called
        without an active exception"), so the thread must be gone before the process exits: the strategy's teardown
        stops it, and an ``atexit`` hook stops any left running (a spawned rank that raised skips the teardown).
        """
        _LIVE.discard(self)
        if not self._thread.is_alive():
            return
        with contextlib.suppress(*STORE_ERRORS):  # the store is gone: the thread's wait fails and it ends by itself
            self._mail(self.rank, {"type": "stop"})
        self._thread.join(wait.total_seconds())

    def idle_clients(self) -> list[Any]:
        """Its store clients, once its thread has ended (for reuse by a later run: ``release_store_clients``)."""
        return [] if self._thread.is_alive() else [self._store, self._thread_store]

    def post(self, record: ErrorRecord) -> ErrorRecord:
        """Post ``record`` unless another error was posted first; wake every watchdog; return the error that won."""
        encoded = json.dumps(record.__dict__)
        winner = self._quick.compare_set("error", "", encoded).decode()
        if winner == encoded:
            for rank in range(self.world_size):
                self._mail(rank, {"type": "error"})
        return ErrorRecord(**json.loads(winner))

    def posted(self) -> ErrorRecord | None:
        """The posted error, if the thread has seen one (no store round trip)."""
        return self._posted

    def read_posted(self) -> ErrorRecord | None:
        """The posted error, asking the store (for a training thread that just saw a collective fail)."""
        if self._posted is None and self._quick.check(["error"]):
            self._posted = ErrorRecord(**json.loads(self._quick.get("error")))
        return self._posted

    def publish_pending(self, count: int) -> None:
        """Say that this rank waits in its ``count``-th check (only ranks that wait long say so)."""
        self._quick.set(f"pending/{self.rank}", str(count))

    def pending_checks(self) -> int:
        """The highest check number any rank said it waits in (0 if none)."""
        keys = [f"pending/{rank}" for rank in range(self.world_size)]
        present = [key for key in keys if self._thread_store.check([key])]
        return max((int(self._thread_store.get(key)) for key in present), default=0)

    def request_completion(self) -> None:
        """Ask every watchdog to complete the checks still pending (see ``on_error``)."""
        for rank in range(self.world_size):
            self._mail(rank, {"type": "complete"})

    def claim(self, key: str) -> bool:
        """Whether this rank is the first to claim ``key`` (so one rank, not all, does a piece of slow-path work)."""
        return bool(self._quick.compare_set(f"claim/{key}", "", str(self.rank)).decode() == str(self.rank))

    def ask_in_thread(self, ranks: list[int], kind: str, timeout: float) -> dict[int, Any]:
        """Ask the watchdogs of ``ranks`` (:func:`ask`) from this watchdog's own thread: a handler of :attr:`handlers`
        (this rank's own watchdog cannot answer then: leave it out of ``ranks``)."""
        return ask(self._thread_store, ranks, kind, timeout)

    def facts_of(self, ranks: list[int]) -> dict[int, Facts]:
        """Ask the watchdogs of ``ranks`` for their facts (ranks that do not answer in time are left out)."""
        answers: dict[int, Facts] = ask(self._store, ranks, "facts", ANSWER_TIMEOUT)
        return answers

    def ask_others(self, kind: str) -> dict[int, Any]:
        """From this watchdog's thread (a handler): every other rank's answer to a request of ``kind``."""
        others = [rank for rank in range(self.world_size) if rank != self.rank]
        return ask(self._thread_store, others, kind, ANSWER_TIMEOUT)

    def tell_everyone(self, kind: str, **fields: str) -> None:
        """From this watchdog's thread (a handler): mail every rank's watchdog, this one's too."""
        for rank in range(self.world_size):
            mail(self._thread_store, rank, {"type": kind, **fields})

    @property
    def store(self) -> object:
        """The training thread's store client (under the run's namespace)."""
        return self._store

    def notify(self, rank: int, kind: str, **fields: str) -> None:
        """Mail ``rank``'s watchdog a message of ``kind`` with ``fields`` (served by its ``handlers[kind]``)."""
        self._mail(rank, {"type": kind, **fields})

    def _mail(self, rank: int, message: dict[str, str]) -> None:
        mail(self._quick, rank, message)

    def _handle(self, store: Any, message: dict[str, str]) -> None:
        """Answer another rank's request, or run the handler of a message (on this watchdog's thread)."""
        kind = message["type"]
        # guards the watchdog's thread from what it runs for others: a rank's stall report (psutil, frames and
        # Lightning's state, read while the training thread changes them), the live straggler check's rows, the
        # preemption stop's handlers. Nothing narrower: whatever they raise, the thread must go on delivering the hang
        # checks' errors; a request left unanswered finds this rank silent, as a rank that cannot answer is
        with contextlib.suppress(Exception):
            if kind in self.answers:
                store.set(f"answer/{message['id']}/{self.rank}", pickle.dumps(self.answers[kind]()))
            else:
                self.handlers[kind](message)

    def _serve(self) -> None:
        store, number = self._thread_store, 1
        while True:
            key = f"mail/{self.rank}/{number}"
            try:
                store.wait([key], _IDLE_WAIT)
                message = json.loads(store.get(key))
            except STORE_ERRORS:  # the store is gone (the run ended): nothing left to serve
                return
            _forget(store, key)
            number += 1
            if message["type"] == "stop":
                return
            if message["type"] in self.answers or message["type"] in self.handlers:
                self._handle(store, message)
            elif message["type"] in ("error", "complete"):
                if self._posted is None:
                    self._posted = ErrorRecord(**json.loads(store.get("error")))
                    facts = self.recorder.snapshot()
                    if facts.inside is not None or facts.backward is not None or facts.forward is not None:
                        # it waits for a rank that failed
                        _collective.abort_process_groups()
                self.on_error()


def mail(store: Any, rank: int, message: dict[str, str]) -> None:
    """Put ``message`` in the mailbox of ``rank``'s watchdog, through ``store`` (a client under the run's namespace)."""
    number = store.add(f"mailbox/{rank}", 1)
    store.set(f"mail/{rank}/{number}", json.dumps(message))


def ask(store: Any, ranks: list[int], kind: str, timeout: float) -> dict[int, Any]:
    """Ask the watchdogs of ``ranks`` for their answer to a request of ``kind`` (``Watchdog.answers``), through
    ``store``; wait up to ``timeout`` seconds and return the answers that came, by rank (each answer is read once and
    removed from the store)."""
    request = uuid.uuid4().hex
    for rank in ranks:
        mail(store, rank, {"type": kind, "id": request})
    keys = {rank: f"answer/{request}/{rank}" for rank in ranks}
    with contextlib.suppress(*STORE_ERRORS):  # some did not answer in time: take the others
        store.wait(list(keys.values()), timedelta(seconds=timeout))
    answers = {}
    for rank, key in keys.items():
        if store.check([key]):
            answers[rank] = pickle.loads(store.get(key))
            _forget(store, key)
    return answers


def _forget(store: Any, key: str) -> None:
    """Remove a key read once (mail, an answer), so that a long run's requests do not pile up in the store."""
    with contextlib.suppress(*STORE_ERRORS):  # a store that cannot delete keeps it: no harm but the memory
        store.delete_key(key)


def _nothing() -> None:
    return None


_LIVE: "weakref.WeakSet[Watchdog]" = weakref.WeakSet()


@atexit.register
def _stop_live_watchdogs() -> None:
    for watchdog in list(_LIVE):
        watchdog.stop(_EXIT_WAIT)


def raise_record(record: ErrorRecord, cause: BaseException | None = None) -> NoReturn:
    """Raise the error a board entry describes (same class, same message, on whichever rank reads it)."""
    cls = getattr(errors, record.cls, errors.RankFailedError)
    raise mark_joint(cls(record.message)) from cause
