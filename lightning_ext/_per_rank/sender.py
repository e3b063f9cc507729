"""A sink's thread that hands its rows to a slow client (MLflow's requests, W&B's ``run.log``), so that the training
thread never waits for the client: it only holds each row, and queues the rows held when they are due
(:mod:`.held_rows`)."""

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from lightning_ext._per_rank.held_rows import HeldRows

__all__ = ["QUEUED", "WAIT_S", "Sender"]

QUEUED = 100  # batches waiting for the thread at most (10,000 rows by default): beyond, the client is stuck
WAIT_S = 30.0  # a flush or the end waits this long at most for the thread (never a hang, even before an error)
# a client found stuck (a full queue, or a wait that ran out) is not waited for again: the run's end pays WAIT_S for it
# once, not a flush's wait, then the end's flush's, then the thread's join

Row = TypeVar("Row")
Item = TypeVar("Item")


class Sender(Generic[Row, Item]):
    """Holds a sink's rows, and calls ``send(item)`` for each item of each batch due, in order, on a thread of its own.

    The first error stops the sending: the items after it are dropped, and :attr:`error` holds it for the training
    thread to report at its next row (the sink's one warning). A client found stuck is waited for no more.

    Args:
        send: hands one item to the client (a W&B row, an MLflow request's metrics).
        items: the items that a batch of rows is sent as (MLflow: requests of at most its limit).
        client: the client, as an error names it (``"W&B's client"``).
        name: the thread's name.
        every_n_rows: rows held before they are due (the per-rank ``flush_every_n_rows``).

    """

    def __init__(
        self,
        send: Callable[[Item], object],
        items: Callable[[list[Row]], list[Item]],
        *,
        client: str,
        name: str,
        every_n_rows: int,
    ) -> None:
        self._send, self._items, self._client = send, items, client
        self._held = HeldRows[Row](every_n_rows)
        self.limit = QUEUED
        self._queue: queue.Queue[list[Item] | None] = queue.Queue(self.limit)
        self.error: BaseException | None = None
        self._stuck = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def hold(self, row: Row) -> None:
        """Keep ``row``; queue the rows held when they are due.

        Raises:
            RuntimeError: :attr:`limit` (:data:`QUEUED`) batches already wait: the client is stuck.

        """
        if self._held.hold(row):
            self.hand_on()

    def hand_on(self) -> None:
        """Queue the rows held (the :meth:`hold` error when the client is stuck)."""
        rows = self._held.take()
        if not rows:
            return
        try:
            self._queue.put_nowait(self._items(rows))
        except queue.Full:
            self._stuck = True
            raise RuntimeError(f"{self._client} has not taken the last {self.limit} batches of rows") from None

    def flush(self) -> BaseException | None:
        """Queue the rows held, then :meth:`wait`; the error that stops the sink, if any: the :meth:`hold` error of a
        stuck client, the wait's (a client that took more than :data:`WAIT_S` for them), or the thread's
        :attr:`error`."""
        try:
            self.hand_on()
        # guards the hand-over: a stuck client's error, or whatever a logger's own code raises while the batch's items
        # are built (any type), hence nothing narrower; the sink stops, never the run
        except Exception as error:
            return error
        if not self.wait():
            return RuntimeError(f"{self._client} has not taken the rows of the last flush within {WAIT_S:.0f} s")
        return self.error

    def wait(self) -> bool:
        """Whether every batch queued was handed over (or dropped after an error) within :data:`WAIT_S`; ``False`` at
        once if the client was found stuck."""
        if not self._stuck:
            done = self._queue.all_tasks_done
            with done:
                self._stuck = not done.wait_for(lambda: not self._queue.unfinished_tasks, WAIT_S)
        return not self._stuck

    def drop(self) -> None:
        """Forget the rows held (the sink stopped)."""
        self._held.take()

    def end(self) -> None:
        """Hand over what is queued, then end the thread (:data:`WAIT_S` at most; at once if the client was found
        stuck: the thread is a daemon, left to the process's end)."""
        if self._stuck:
            return
        try:
            self._queue.put(None, timeout=WAIT_S)
        except queue.Full:
            self._stuck = True
            return
        self._thread.join(WAIT_S)

    def _run(self) -> None:
        while True:
            items = self._queue.get()
            try:
                if items is None:
                    return
                for item in items:
                    if self.error is None:
                        self._send(item)
            except BaseException as error:  # reported by the training thread at its next row
                self.error = error
            finally:
                self._queue.task_done()
