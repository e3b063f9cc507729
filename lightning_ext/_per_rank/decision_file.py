"""Rank 0's decision record, ``<log_dir>/decisions.csv``: one row per decision, crash-safe, never ending a run."""

import contextlib
import datetime
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from lightning_ext._per_rank.decision_format import COLUMNS, FILENAME, encode_row
from lightning_ext._per_rank.markers import SUFFIX, encode_marker, read_rank_marker, remove_markers, write_marker
from lightning_ext._per_rank.parted_file import PartedFile
from lightning_ext._per_rank.storage import LocalFile, join, split_location, write_whole
from lightning_ext.errors import DecisionRecordWarning

__all__ = ["MARKER_FORMAT", "DecisionFile"]

MARKER_FORMAT = "lightning-ext decision record incomplete/1"

_WRITTEN_HERE: set[str] = set()  # records this process wrote: a later fit here continues them
_STOPPED_HERE: set[str] = set()  # records whose writing failed in this process: they stay stopped


class DecisionFile:
    """Rank 0's record of every cross-rank decision of a run; never raises into the training.

    Each row is written as soon as it is recorded, by the per-rank files' storages: on a local disk one ``os.write``
    on an ``O_APPEND`` descriptor (the first, with the header, an atomic replacement), ``fsync`` on :meth:`close`; on
    any other fsspec filesystem one object per row, merged on :meth:`close`. An earlier run's file is moved aside to
    ``decisions.csv.<n>``; a resumed run keeps the rows up to its step; a later fit in the same process continues the
    file. If anything fails, one :class:`~lightning_ext.errors.DecisionRecordWarning` names the error, the file is
    marked incomplete (``decisions.csv.incomplete``), and recording stops for the process.

    Args:
        log_dir: the run's log directory (a path or an fsspec URL).
        run: the run's id, written in every row.

    """

    def __init__(self, log_dir: str, run: str) -> None:
        self._log_dir = log_dir
        self._run = run
        self.path = join(log_dir, FILENAME)
        self._storage: LocalFile | PartedFile | None = None
        self._has_header = False
        self._rows = 0
        self._last_step: int | None = None
        self.stopped = self.path in _STOPPED_HERE
        self.resume_from_step: int | None = None

    def record(self, build: Callable[[], Mapping[str, Any]]) -> None:
        """Write the row that ``build`` makes (called here, so that an error in it steps aside as well)."""
        if self.stopped:
            return
        doing = "building a row"
        try:
            row = {**build(), "run": self._run}
            row["time"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            cells = encode_row(row)
            storage = self._storage
            if storage is None:
                doing = "opening the file"
                storage = self._open()
            doing = "writing a row"
            storage.write(list(COLUMNS), [cells], new_header=not self._has_header)
            self._has_header = True
            self._rows += 1
            self._last_step = int(row["step"])
            storage.settle()
        except Exception as error:
            self._stop(error, doing)

    def close(self) -> None:
        """``fsync`` the file (or merge its parts); the strategy's teardown calls it at the end of every stage."""
        storage, self._storage = self._storage, None
        if storage is None or self.stopped:
            return
        try:
            storage.close()
        except Exception as error:
            self._storage = storage
            self._stop(error, "closing the file")
        finally:
            storage.discard()

    def _open(self) -> LocalFile | PartedFile:
        fs, where, local = split_location(self.path)
        storage = LocalFile(where) if local else PartedFile(fs, where, fs.unstrip_protocol(where))
        resume = self.resume_from_step
        if resume is None and self.path in _WRITTEN_HERE:
            resume = sys.maxsize  # keep every row
        marker = read_rank_marker(self._log_dir, FILENAME, 0)
        start = storage.start(resume)
        _WRITTEN_HERE.add(self.path)
        if marker is not None and start.rotated_to is not None:  # the marker goes with the earlier run's file
            write_whole(start.rotated_to + SUFFIX, encode_marker(marker))
            remove_markers(self._log_dir, FILENAME, 0)
        self._storage = storage
        self._has_header = start.fieldnames == list(COLUMNS)
        self._rows = start.rows
        return storage

    def _stop(self, error: Exception, doing: str) -> None:
        self.stopped = True
        _STOPPED_HERE.add(self.path)
        storage, self._storage = self._storage, None
        if storage is not None:
            with contextlib.suppress(Exception):
                storage.close()
            storage.discard()
        reason = f"{type(error).__name__}: {error} (while {doing})"
        try:
            marker = write_marker(
                self._log_dir,
                FILENAME,
                0,
                file=self.path,
                reason=reason,
                rows_written=self._rows,
                last_step=self._last_step,
                kind=MARKER_FORMAT,
            )
            recorded = f"is marked incomplete in {marker}"
        except Exception as marker_error:
            recorded = f"could not be marked incomplete either ({type(marker_error).__name__}: {marker_error})"
        warnings.warn(
            f"The decision record stopped: {reason}. {self.path} keeps the {self._rows} decision(s) written so far and"
            f" {recorded}. Training goes on.",
            DecisionRecordWarning,
            stacklevel=3,
        )
