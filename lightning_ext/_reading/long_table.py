"""The long table's columns, filled rank after rank in place, in memory close to the table's own size."""

from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from lightning_ext._files.csv_format import EPOCH, RANK, STEP

__all__ = ["Columns"]

_MISSING = "\0epoch missing"  # the mask of the epoch column; NUL is in no metric name
_OWN = (RANK, STEP, EPOCH, _MISSING)


class Columns:
    """The table's columns as they are filled, rank after rank: each grows in place, with some room to spare.

    ``rank`` and ``step`` are int64; ``epoch`` is int64 values with a mask of the missing ones (the parts of a
    nullable Int64 column); the metrics are float64, NaN where a file lacks them.

    Example:
        >>> columns = Columns()
        >>> columns.append(0, {"step": [np.array([0]), np.array([1])], "loss": [np.array([0.5, 0.25])]})
        >>> columns.append(1, {"step": [np.array([0])], "acc": [np.array([1.0])]})
        >>> columns.frame(["acc", "loss"])
           rank  step  epoch  acc  loss
        0     0     0   <NA>  NaN  0.50
        1     0     1   <NA>  NaN  0.25
        2     1     0   <NA>  1.0   NaN

    """

    def __init__(self) -> None:
        self.capacity = 0
        self.rows = 0
        self.arrays: dict[str, NDArray[Any]] = {}
        self.rank_rows: dict[int, int] = {}  # rank -> its rows, in the order written

    def reserve(self, capacity: int) -> None:
        """Room for ``capacity`` rows in the columns made from now on."""
        self.capacity = max(self.capacity, capacity)

    def append(self, rank: int, values: dict[str, list[NDArray[Any]]]) -> None:
        """Add one file's rows: ``values`` holds each column in pieces (in order): ``step``, maybe ``epoch`` (floats
        with NaN for missing, or ints), and metrics."""
        count = sum(len(piece) for piece in values[STEP])
        start, end = self.rows, self.rows + count
        if end > self.capacity or not self.arrays:
            self.capacity = max(end, self.capacity if not self.arrays else int(self.capacity * 1.25) + 1024)
            for name in self.arrays:
                self.arrays[name] = _grown(self.arrays[name], self.capacity)
            for name in (RANK, STEP, EPOCH, _MISSING):
                self._column(name)
        self.arrays[RANK][start:end] = rank
        if EPOCH not in values:
            self.arrays[EPOCH][start:end] = 0
            self.arrays[_MISSING][start:end] = True
        for name, pieces in values.items():
            target = self._column(name)
            at = start
            for piece in pieces:
                if name == EPOCH:
                    missing = np.isnan(piece) if piece.dtype.kind == "f" else False
                    target[at : at + len(piece)] = np.where(missing, 0, piece) if piece.dtype.kind == "f" else piece
                    self.arrays[_MISSING][at : at + len(piece)] = missing
                else:
                    target[at : at + len(piece)] = piece
                at += len(piece)
        for name, array in self.arrays.items():
            if name not in values and name not in _OWN:
                array[start:end] = np.nan
        self.rows = end
        self.rank_rows[rank] = self.rank_rows.get(rank, 0) + count

    def drop_rank(self, rank: int) -> None:
        """Forget ``rank``'s rows (the last rank written, if any)."""
        self.rows -= self.rank_rows.pop(rank, 0)

    def frame(self, metrics: list[str]) -> pd.DataFrame:
        """The table, each column cut to its rows in place (no copy)."""
        if not self.arrays:
            self.append(0, {STEP: [np.empty(0, dtype=np.int64)]})
        columns: dict[str, Any] = {RANK: self._take(RANK), STEP: self._take(STEP)}
        columns[EPOCH] = pd.arrays.IntegerArray(self._take(EPOCH), self._take(_MISSING))
        for name in metrics:
            columns[name] = self._take(name) if name in self.arrays else np.full(self.rows, np.nan)
        return pd.DataFrame(columns, copy=False)

    def _column(self, name: str) -> NDArray[Any]:
        array = self.arrays.get(name)
        if array is None:
            dtype = bool if name == _MISSING else np.int64 if name in _OWN else np.float64
            array = self.arrays[name] = np.empty(self.capacity, dtype=dtype)
            # a metric that no earlier file had (``step`` is in every file)
            array[: self.rows] = True if name == _MISSING else 0 if name in _OWN else np.nan
        return array

    def _take(self, name: str) -> NDArray[Any]:
        array = self.arrays.pop(name)
        if len(array) != self.rows:
            array.resize(self.rows, refcheck=False)  # gives the spare room back, without a copy
        return array


def _grown(array: NDArray[Any], capacity: int) -> NDArray[Any]:
    grown = np.empty(capacity, dtype=array.dtype)
    grown[: len(array)] = array
    return grown
