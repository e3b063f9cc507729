"""Rank 0's decision record, ``<log_dir>/decisions.csv``: one row per decision, crash-safe, never ending a run."""

import datetime
from collections.abc import Callable, Mapping
from typing import Any

from lightning_ext._decisions.record_format import COLUMNS, FILENAME, encode_row
from lightning_ext._files.file_output import FileOutput, storage_for
from lightning_ext._files.parted_file import PartedFile
from lightning_ext._files.storage import LocalFile, Start, guarded
from lightning_ext.errors import DecisionRecordWarning

__all__ = ["MARKER_FORMAT", "DecisionFile"]

MARKER_FORMAT = "lightning-ext decision record incomplete/1"


class DecisionFile(FileOutput):
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
        super().__init__(
            log_dir,
            FILENAME,
            0,
            owner="The decision record",
            unit="decision(s)",
            warning=DecisionRecordWarning,
            marker_format=MARKER_FORMAT,
        )
        self._run = run
        self._storage: LocalFile | PartedFile | None = None
        self._has_header = False
        self._rows = 0
        self._last_step: int | None = None

    def record(self, build: Callable[[], Mapping[str, Any]]) -> None:
        """Write the row that ``build`` makes (called here, so that an error in it steps aside as well)."""
        if self.stopped:
            return
        doing = "building a row"
        with guarded() as failure:
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
        if failure.error is not None:
            self._stop(failure.error, doing)

    def close(self) -> None:
        """``fsync`` the file (or merge its parts); the strategy's teardown calls it at the end of every stage."""
        storage, self._storage = self._storage, None
        if storage is None or self.stopped:
            return
        try:
            with guarded() as failure:
                storage.close()
            if failure.error is not None:
                self._storage = storage
                self._stop(failure.error, "closing the file")
        finally:
            storage.discard()

    def _open(self) -> LocalFile | PartedFile:
        def start(resume: int | None) -> tuple[LocalFile | PartedFile, Start]:
            storage = storage_for(self.path)
            return storage, storage.start(resume)

        storage, started = self.open(start, lambda opened: opened[1].rotated_to)
        self._storage = storage
        self._has_header = started.fieldnames == list(COLUMNS)
        self._rows = started.rows
        return storage

    def _stop(self, error: Exception, doing: str) -> None:
        storage, self._storage = self._storage, None

        def release() -> None:
            if storage is not None:
                try:
                    storage.close()
                finally:
                    storage.discard()

        self.stop(error, doing, release, lambda: (self._rows, self._last_step))
