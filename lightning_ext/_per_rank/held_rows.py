"""When a sink hands its rows on to its logger's client: the one rule of TensorBoard's events, MLflow's and W&B's runs.

Every ``flush_every_n_rows`` rows or :data:`WRITE_EVERY_S` seconds (checked at each row), and at each flush: a client
woken for every row would compete with the training thread for a core and the GIL at every step. The CSV file keeps
its own buffer (``RankMetricsWriter``)."""

import time
from typing import Generic, TypeVar

__all__ = ["WRITE_EVERY_S", "HeldRows"]

WRITE_EVERY_S = 10.0
"""Rows wait at most this long (checked at each row) before they are handed on."""

Row = TypeVar("Row")


class HeldRows(Generic[Row]):
    """The rows a sink holds until they are due.

    Example:
        >>> held = HeldRows[int](every_n_rows=2)
        >>> held.hold(1), held.hold(2)
        (False, True)
        >>> held.take(), held.take()
        ([1, 2], [])

    Args:
        every_n_rows: rows held before they are due (the per-rank ``flush_every_n_rows``).

    """

    def __init__(self, every_n_rows: int) -> None:
        self.every_n_rows = every_n_rows
        self._rows: list[Row] = []
        self._since = time.monotonic()

    def hold(self, row: Row) -> bool:
        """Keep ``row``; whether the rows held are due: ``every_n_rows`` of them, or :data:`WRITE_EVERY_S` seconds
        since the last :meth:`take`."""
        rows = self._rows
        rows.append(row)
        return len(rows) >= self.every_n_rows or time.monotonic() - self._since >= WRITE_EVERY_S

    def take(self) -> list[Row]:
        """The rows held, in order; none are held after it, and the time starts again."""
        rows, self._rows, self._since = self._rows, [], time.monotonic()
        return rows
