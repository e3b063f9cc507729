"""The long table's columns, filled rank after rank in place, in memory close to the table's own size.

Each column is one array with some room to spare, grown by a quarter when full (one column copied at a time) and cut
to its rows at the end without a copy (``ndarray.resize``), so the reader never holds the rows twice. A metric that
appears in a later file gets its column then, missing (NaN) on the rows before.

Example:
    >>> columns = Columns()
    >>> columns.append(0, {"step": np.array([0, 1]), "loss": np.array([0.5, 0.25])})
    >>> columns.append(1, {"step": np.array([0]), "acc": np.array([1.0])})
    >>> columns.frame(["acc", "loss"])
       rank  step  epoch  acc  loss
    0     0     0   <NA>  NaN  0.50
    1     0     1   <NA>  NaN  0.25
    2     1     0   <NA>  1.0   NaN

"""

from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from lightning_ext._metrics_csv import EPOCH, RANK, STEP

__all__ = ["Columns"]


class Columns:
    """The table's columns as they are filled, rank after rank: each grows in place, with some room to spare."""

    def __init__(self) -> None:
        self.capacity = 0
        self.rows = 0
        self.arrays: dict[str, NDArray[Any]] = {}
        self.rank_rows: dict[int, int] = {}  # rank -> its rows, in the order written

    def reserve(self, capacity: int) -> None:
        self.capacity = max(self.capacity, capacity)

    def append(self, rank: int, values: dict[str, NDArray[Any]]) -> None:
        count = len(values[STEP])
        end = self.rows + count
        if end > self.capacity:
            self.capacity = max(end, int(self.capacity * 1.25) + 1024)
            for name in self.arrays:
                self.arrays[name] = _grown(self.arrays[name], self.capacity)
        for name, column in values.items():
            if name not in self.arrays:
                array = np.empty(self.capacity, dtype=np.int64 if name == STEP else np.float64)
                if self.rows:
                    array[: self.rows] = np.nan  # a metric that no earlier file had (``step`` is in every file)
                self.arrays[name] = array
            self.arrays[name][self.rows : end] = column
        for name, array in self.arrays.items():
            if name not in values:
                array[self.rows : end] = np.nan
        self.rows = end
        self.rank_rows[rank] = self.rank_rows.get(rank, 0) + count

    def drop_rank(self, rank: int) -> None:
        """Forget ``rank``'s rows (the last rank written, if any)."""
        self.rows -= self.rank_rows.pop(rank, 0)

    def frame(self, metrics: list[str]) -> pd.DataFrame:
        """The table, each column cut to its rows (in place), epoch made nullable Int64."""
        ranks = np.fromiter(self.rank_rows, dtype=np.int64, count=len(self.rank_rows))
        columns: dict[str, Any] = {RANK: np.repeat(ranks, np.fromiter(self.rank_rows.values(), dtype=np.int64))}
        columns[STEP] = self._take(STEP, np.int64)
        epoch = self._take(EPOCH, np.float64)
        missing = np.isnan(epoch)
        columns[EPOCH] = pd.arrays.IntegerArray(np.where(missing, 0, epoch).astype(np.int64), missing)
        del epoch
        for name in metrics:
            columns[name] = self._take(name, np.float64)
        return pd.DataFrame(columns, copy=False)

    def _take(self, name: str, dtype: type[np.generic]) -> NDArray[Any]:
        array = self.arrays.pop(name, None)
        if array is None:
            return np.full(self.rows, np.nan, dtype=dtype)
        if len(array) != self.rows:
            array.resize(self.rows, refcheck=False)  # gives the spare room back, without a copy
        return array


def _grown(array: NDArray[Any], capacity: int) -> NDArray[Any]:
    grown = np.empty(capacity, dtype=array.dtype)
    grown[: len(array)] = array
    return grown
