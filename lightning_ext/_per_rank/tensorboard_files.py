"""Each rank's TensorBoard event files: the per-rank rows as scalars in ``<log_dir>/rank_<r>/``, one run per rank.

Written for each ``TensorBoardLogger`` of the trainer, under its ``log_dir``, with its writer, tags and steps: this
rank's local values, one event per row, handed on by the rule of :mod:`.held_rows`. A failure warns once and stops
them on that rank only (``docs/per-rank-metrics.md``, "TensorBoard").
"""

import importlib
import posixpath
import struct
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from lightning.fabric.loggers.tensorboard import _TENSORBOARD_AVAILABLE
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_ext._files.storage import glob_escape, guarded, join, split_location, write_whole
from lightning_ext._per_rank.held_rows import HeldRows
from lightning_ext._per_rank.rank_sink import metric_key, sink_output, telemetry_values
from lightning_ext._per_rank.writer import PerRankMetrics

__all__ = ["EVENT_FILES", "RANK_DIRECTORY", "RankEventFiles", "events_up_to", "sink_for"]

RANK_DIRECTORY = "rank_{rank}"  # under the log directory: one TensorBoard run per rank
EVENT_FILES = "events.out.tfevents.*"  # TensorBoard's own name for its event files
_WRITER_OPTIONS = ("max_queue", "flush_secs", "filename_suffix")  # a TensorBoardLogger's options that reach its writer
_HEADER = struct.Struct("<QI")  # a record: its length, the length's CRC, the event, the event's CRC (TFRecord)
# by whether tensorboard is installed, as Lightning's TensorBoardLogger chooses: the writer's module, its protobufs
_WRITERS = {
    True: ("torch.utils.tensorboard", "tensorboard.compat.proto"),
    False: ("tensorboardX", "tensorboardX.proto"),
}


def sink_for(logger: TensorBoardLogger, rank: int, options: PerRankMetrics, seen: set[str]) -> "RankEventFiles | None":
    """This rank's event files under ``logger``'s ``log_dir`` (its version agreed by every rank at set-up).

    Args:
        logger: one of the trainer's TensorBoard loggers.
        rank: this process's global rank.
        options: the per-rank options (``telemetry``).
        seen: the directories already written by another TensorBoard logger of this trainer (``None`` for the second
            logger of the same directory).

    """
    log_dir = str(logger.log_dir)
    if log_dir in seen:
        return None
    seen.add(log_dir)
    writer_options = {name: value for name, value in logger._kwargs.items() if name in _WRITER_OPTIONS}
    return RankEventFiles(
        log_dir,
        rank,
        prefix=logger._prefix,
        writer_options=writer_options,
        telemetry=options.telemetry,
        every_n_rows=options.flush_every_n_rows,
    )


class RankEventFiles:
    """This rank's TensorBoard event files (a :class:`~lightning_ext._per_rank.rank_sink.RankSink`); never raises.

    The writer opens on the first row. Rows are held and handed to it together (every ``every_n_rows`` rows or
    :data:`~lightning_ext._per_rank.held_rows.WRITE_EVERY_S` seconds, and at :meth:`flush` and :meth:`close`): its
    thread then wakes once for them, not once per training step.

    A run resumed from a checkpoint first drops, from the event files already there, every event after the
    checkpoint's step (the resumed run logs those steps again), as the CSV file drops its rows: TensorBoard's readers
    do not drop them by themselves (``tensorboard`` 2.21 ignores a ``purge_step``).

    Args:
        log_dir: the run's log directory (a path or an fsspec URL the writer accepts).
        rank: this process's global rank.
        prefix: the ``TensorBoardLogger``'s ``prefix``, put before each tag as that logger does.
        writer_options: the logger's options for its writer (``max_queue``, ``flush_secs``, ``filename_suffix``).
        telemetry: telemetry is on: a metric of the user's named ``telemetry/...`` becomes ``metric:telemetry/...``,
            as in the CSV file, so that it does not mix with the rank's telemetry.
        every_n_rows: rows held before they are handed to the writer (the per-rank ``flush_every_n_rows``).

    """

    def __init__(
        self,
        log_dir: str,
        rank: int,
        *,
        prefix: str = "",
        writer_options: Mapping[str, Any] | None = None,
        telemetry: bool = False,
        every_n_rows: int = 100,
    ) -> None:
        self.directory = join(log_dir, RANK_DIRECTORY.format(rank=rank))
        self._prefix = f"{prefix}{TensorBoardLogger.LOGGER_JOIN_CHAR}" if prefix else ""
        self._writer_options = dict(writer_options or {})
        self._telemetry = telemetry
        self._writer: Any = None
        self._file_writer: Any = None
        self._classes: _WriterClasses | None = None
        self._held = HeldRows[tuple[list[tuple[str, float]], int, float]](every_n_rows)  # (values, step, wall time)
        self.resume_from_step: int | None = None
        self._output = sink_output(self.directory, f"Per-rank TensorBoard events of rank {rank}")
        self.stopped = self._output.stopped
        if not self.stopped:
            with guarded() as failure:
                self._classes = _writer_classes()  # imported at set-up, not in the first training step
            if failure.error is not None:
                self._stop(failure.error, "loading TensorBoard's writer")

    def log_row(self, row: Mapping[str, float], step: int) -> None:
        """Write one logged row (a per-rank CSV row: this rank's local values, by name) as one event at ``step``."""
        prefix, telemetry = self._prefix, self._telemetry
        self._write(((prefix + metric_key(name, telemetry), value) for name, value in row.items()), step)

    def log_telemetry(self, row: Mapping[str, float], step: int) -> None:
        """Write a telemetry row's ``telemetry/*`` columns (its ``epoch`` is already in the metric rows)."""
        self._write(((self._prefix + name, value) for name, value in telemetry_values(row).items()), step)

    def flush(self) -> None:
        """Hand the rows held to the writer, and wait until its events are in the file."""
        if self._file_writer is not None and not self.stopped:
            with guarded() as failure:
                self._hand_on()
                self._file_writer.flush()
            if failure.error is not None:
                self._stop(failure.error, "writing events")

    def close(self, failed: bool = False) -> None:
        """Hand the rows held to the writer, flush and close the event file (the end of each stage); a later row
        opens a new one."""
        if self._writer is not None and not self.stopped:
            with guarded() as failure:
                self._hand_on()
            if failure.error is not None:
                self._stop(failure.error, "writing events")
        writer, self._writer, self._file_writer = self._writer, None, None
        if writer is not None and not self.stopped:
            with guarded() as failure:
                writer.close()
            if failure.error is not None:
                self._stop(failure.error, "closing the event file")

    def abandon(self) -> None:
        """Close the event file and write nothing more."""
        self.close()
        self.stopped = True

    def _write(self, values: Any, step: int) -> None:
        classes = self._classes
        if self.stopped or classes is None:  # no classes: stopped at set-up
            return
        doing = "opening the event file"
        with guarded() as failure:
            if self._file_writer is None:
                self._open(self.resume_from_step, classes)
            doing = "writing a row"
            scalars = [(tag, float(value)) for tag, value in values]
            if scalars and self._held.hold((scalars, step, time.time())):
                self._hand_on()
        if failure.error is not None:
            self._stop(failure.error, doing)

    def _hand_on(self) -> None:
        """Give the writer one event per row held, each with its row's step and time."""
        classes, rows = self._classes, self._held.take()
        if classes is None or self._file_writer is None:  # stopped: nothing is handed on
            return
        summary, value, add = classes.summary, classes.summary.Value, self._file_writer.add_summary
        for scalars, step, wall_time in rows:
            add(summary(value=[value(tag=tag, simple_value=number) for tag, number in scalars]), step, wall_time)

    def _open(self, resumed_from: int | None, classes: "_WriterClasses") -> None:
        if resumed_from is not None:
            self._drop_events_after(resumed_from, classes.event)
        self._writer = classes.writer(log_dir=self.directory, **self._writer_options)
        self._file_writer = self._writer._get_file_writer()  # as Lightning's log_hyperparams reaches it

    def _drop_events_after(self, step: int, event_class: Any) -> None:
        """Rewrite each event file already in the directory without its events after ``step`` (and a torn tail)."""
        fs, directory, local = split_location(self.directory)
        if not fs.isdir(directory):
            return
        for path in sorted(fs.glob(posixpath.join(glob_escape(directory), EVENT_FILES))):
            kept = events_up_to(fs.cat_file(path), step, event_class)
            if kept is not None:
                write_whole(path if local else fs.unstrip_protocol(path), kept)

    def _stop(self, error: Exception, doing: str) -> None:
        """Stop this rank's event files for the rest of the process, keeping what was written; warn once."""
        self.stopped = True
        self._held.take()  # what was not handed on is dropped: the writer cannot take it
        writer, self._writer, self._file_writer = self._writer, None, None

        def release() -> None:
            if writer is not None:  # the writer's thread may have failed; what it wrote stays
                writer.close()

        self._output.step_aside(error, doing, lambda _: f"{self.directory} keeps the events written so far", release)


class _WriterClasses(NamedTuple):
    """TensorBoard's classes, imported at set-up (not in the first training step)."""

    writer: Any  # the SummaryWriter class that TensorBoardLogger uses
    event: Any  # its package's Event, to read back the events of a resumed run
    summary: Any  # its package's Summary, one per written row


def _writer_classes() -> _WriterClasses:
    """The ``SummaryWriter`` class that ``TensorBoardLogger`` uses, and its package's ``Event`` and ``Summary``."""
    writer, protos = _WRITERS[bool(_TENSORBOARD_AVAILABLE)]
    return _WriterClasses(
        importlib.import_module(writer).SummaryWriter,
        importlib.import_module(f"{protos}.event_pb2").Event,
        importlib.import_module(f"{protos}.summary_pb2").Summary,
    )


def events_up_to(data: bytes, step: int, event_class: Any) -> bytes | None:
    """An event file's records whose event has ``step <= step``, byte for byte; ``None`` if that is every record.

    A record cut short at the end (a crash mid-write) is dropped too, and so is anything after a record that does not
    parse.

    Args:
        data: the event file's bytes (TFRecord: length, CRC of the length, the serialized ``Event``, its CRC).
        step: the last step kept.
        event_class: the ``Event`` protobuf class of the writer's package.

    """
    # protobuf's (both TensorBoard writers' events are protobuf messages), imported with the writer's classes
    decode_error = importlib.import_module("google.protobuf.message").DecodeError
    kept, position, dropped = [], 0, False
    while position + _HEADER.size <= len(data):
        length = _HEADER.unpack_from(data, position)[0]
        start, end = position + _HEADER.size, position + _HEADER.size + length + 4
        if end > len(data):
            break
        try:
            event = event_class.FromString(data[start : start + length])
        except decode_error:  # a record that does not parse: the rest cannot be trusted
            break
        if event.step <= step:
            kept.append(data[position:end])
        else:
            dropped = True
        position = end
    return b"".join(kept) if dropped or position < len(data) else None
