"""An output of a run that must never stop training: stopped with one warning; a file's opening, resume and marker.

Every per-rank sink (the CSV file, TensorBoard's events, MLflow's and W&B's runs) and the decision record stop through
:class:`Output`; the files add their storage, the registry of the files written here and the incomplete-marker's life.
"""

import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from lightning_ext._files.markers import (
    FORMAT,
    SUFFIX,
    encode_marker,
    read_rank_marker,
    remove_markers,
    write_marker,
)
from lightning_ext._files.parted_file import PartedFile
from lightning_ext._files.storage import LocalFile, guarded, join, split_location, write_whole

__all__ = ["FileOutput", "Output", "storage_for"]

Handle = TypeVar("Handle")

_WRITTEN_HERE: set[str] = set()  # files this process wrote: a later fit/validate/test here continues them
_STOPPED_HERE: set[str] = set()  # outputs (a file's path, a sink's key) that failed in this process: they stay stopped


def storage_for(path: str) -> LocalFile | PartedFile:
    """The storage of ``path``: a local file appended durably, or one object per flush on any other filesystem."""
    fs, where, local = split_location(path)
    return LocalFile(where) if local else PartedFile(fs, where, fs.unstrip_protocol(where))


class Output:
    """One output that never stops a run: after its first failure it stays stopped in this process, said once.

    Args:
        key: what identifies the output in this process (a file's path; a sink's run), so that a later stage in the
            same process finds it stopped and says nothing more.
        owner: who writes it, as the warning's first words (``"Per-rank metrics of rank 1"``).
        warning: the warning's class.
        aftermath: the warning's last sentence (what goes on).

    """

    def __init__(self, key: str, *, owner: str, warning: type[Warning], aftermath: str = "Training goes on.") -> None:
        self.key = key
        self._owner, self._warning, self._aftermath = owner, warning, aftermath
        self.stopped = key in _STOPPED_HERE

    def step_aside(
        self,
        error: BaseException,
        doing: str,
        kept: Callable[[str], str],
        release: Callable[[], object] = lambda: None,
        stacklevel: int = 4,
    ) -> None:
        """Stop for the rest of the process: ``release()`` what can be kept (its errors ignored), then warn once:
        ``"<owner> stopped: <reason>. <kept(reason)>. <aftermath>"``. A second call does nothing.

        ``stacklevel`` 4 names the owner's caller: step_aside <- the owner's stop <- the owner's method <- its caller.
        """
        if self.stopped:
            return
        self.stopped = True
        _STOPPED_HERE.add(self.key)
        with guarded():  # what can be kept is kept; the error to report is the one that stopped the output
            release()
        reason = f"{type(error).__name__}: {error} (while {doing})"
        warnings.warn(f"{self._owner} stopped: {reason}. {kept(reason)}. {self._aftermath}", self._warning, stacklevel)


class FileOutput(Output):
    """The life of one output file in this process: where it is, how it opens, and how it stops (marked incomplete).

    Args:
        log_dir: the run's log directory (a path or an fsspec URL).
        filename: the file relative to ``log_dir``; ``{rank}`` is replaced by ``rank``.
        rank: the rank whose file it is (its marker's name and record).
        owner: who writes it, as the warning's first words (``"Per-rank metrics of rank 1"``).
        unit: what its rows are, as the warning counts them (``"row(s)"``).
        warning: the warning's class.
        marker_format: the marker's ``format``.
        aftermath: the warning's last sentence (what goes on).

    """

    def __init__(
        self,
        log_dir: str,
        filename: str,
        rank: int,
        *,
        owner: str,
        unit: str,
        warning: type[Warning],
        marker_format: str = FORMAT,
        aftermath: str = "Training goes on.",
    ) -> None:
        self.log_dir, self.filename, self.rank = log_dir, filename, rank
        self.path = join(log_dir, filename.replace("{rank}", str(rank)))
        super().__init__(self.path, owner=owner, warning=warning, aftermath=aftermath)
        self._unit, self._marker_format = unit, marker_format
        self.resume_from_step: int | None = None

    def open(self, opener: Callable[[int | None], Handle], rotated_to: Callable[[Handle], str | None]) -> Handle:
        """Open the file with ``opener(resume_from_step)`` and settle an earlier run's marker.

        A resumed run (:attr:`resume_from_step` set) keeps the rows up to that step; a later stage in this process
        continues the file (every row kept); a new run moves an earlier file aside, ``rotated_to(handle)`` says where.
        """
        resume = self.resume_from_step
        if resume is None and self.path in _WRITTEN_HERE:
            resume = sys.maxsize  # keep every row
        marker = read_rank_marker(self.log_dir, self.filename, self.rank)
        handle = opener(resume)
        _WRITTEN_HERE.add(self.path)
        if marker is not None:
            self._settle_marker(marker, resume, rotated_to(handle))
        return handle

    def stop(
        self, error: Exception, doing: str, release: Callable[[], object], written: Callable[[], tuple[int, int | None]]
    ) -> None:
        """Stop writing for the rest of the process: ``release()`` what can be kept (its errors ignored), mark the file
        incomplete with ``written()`` (rows, last step), and warn once. Called from the owner's ``_stop``."""

        def kept(reason: str) -> str:
            rows, last_step = written()
            with guarded() as failure:
                marker = write_marker(
                    self.log_dir,
                    self.filename,
                    self.rank,
                    file=self.path,
                    reason=reason,
                    rows_written=rows,
                    last_step=last_step,
                    kind=self._marker_format,
                )
                recorded = f"is marked incomplete in {marker}"
            if failure.error is not None:
                recorded = f"could not be marked incomplete either ({type(failure.error).__name__}: {failure.error})"
            return f"{self.path} keeps the {rows} {self._unit} written so far and {recorded}"

        self.step_aside(error, doing, kept, release, stacklevel=5)

    def _settle_marker(self, marker: dict[str, Any], resume: int | None, rotated_to: str | None) -> None:
        """A marker left by an earlier run: it moves with a rotated file, and goes once the file is whole again."""
        last = marker.get("last_step")
        if resume is None:
            if rotated_to is not None:
                write_whole(rotated_to + SUFFIX, encode_marker(marker))
            remove_markers(self.log_dir, self.filename, self.rank)
        elif isinstance(last, int) and resume < last:
            # rows with step <= resume < last were all written, and the resumed run writes every later one again
            remove_markers(self.log_dir, self.filename, self.rank)
