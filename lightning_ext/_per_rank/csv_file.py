"""This rank's CSV file as a sink: opened (resumed, continued or rotated) on the first row, marked incomplete on a
failure; the file every rank always writes (``docs/per-rank-metrics.md``)."""

import atexit
from collections.abc import Mapping

from lightning_ext._files.csv_format import TELEMETRY
from lightning_ext._files.file_output import FileOutput
from lightning_ext._files.storage import guarded
from lightning_ext._per_rank.writer import PerRankMetrics, RankMetricsWriter
from lightning_ext.errors import RankMetricsWarning

__all__ = ["RankCSVFile"]

_OPEN_WRITERS: dict[str, RankMetricsWriter] = {}  # by path: a later stage in this process continues the same writer


class RankCSVFile:
    """This rank's CSV file (a :class:`~lightning_ext._per_rank.rank_sink.RankSink`); never raises.

    Args:
        log_dir: the run's log directory (a path or an fsspec URL), identical on every rank.
        rank: this process's global rank.
        options: file name template and flush interval.

    """

    def __init__(self, log_dir: str, rank: int, options: PerRankMetrics) -> None:
        self._options = options
        self._output = FileOutput(
            log_dir,
            options.filename,
            rank,
            owner=f"Per-rank metrics of rank {rank}",
            unit="row(s)",
            warning=RankMetricsWarning,
            aftermath="Training goes on; the other ranks' files are not affected.",
        )
        self.path = self._output.path
        self._writer: RankMetricsWriter | None = None

    @property
    def stopped(self) -> bool:
        """Whether this rank's file stopped after an error."""
        return self._output.stopped

    @property
    def resume_from_step(self) -> int | None:
        """The logging step a resumed run starts from: later rows are dropped from the file (they are logged again)."""
        return self._output.resume_from_step

    @resume_from_step.setter
    def resume_from_step(self, step: int | None) -> None:
        self._output.resume_from_step = step

    @property
    def writer(self) -> RankMetricsWriter:
        """The writer of this rank's file, opened on first use (see ``RankMetricsLogger.experiment``)."""
        writer = self._writer if self._writer is not None else _OPEN_WRITERS.get(self.path)
        if writer is None:
            writer = self._output.open(self._new_writer, lambda opened: opened.rotated_to)
        self._writer = writer
        return writer

    def _new_writer(self, resume_from_step: int | None) -> RankMetricsWriter:
        options = self._options
        writer = RankMetricsWriter(
            self.path, flush_every_n_rows=options.flush_every_n_rows, resume_from_step=resume_from_step
        )
        if options.telemetry:
            writer.reserve(TELEMETRY)  # a user's metric named telemetry/... goes to metric:telemetry/...
        _OPEN_WRITERS[self.path] = writer  # before the marker is settled: a failure there closes it (stop)
        return writer

    def log_row(self, row: Mapping[str, float], step: int) -> None:
        """Write one row (buffered: see ``flush_every_n_rows``)."""
        if self.stopped:
            return
        writer = self._writer
        doing = "opening the file" if writer is None else "writing a row"
        with guarded() as failure:
            if writer is None:
                writer = self.writer
                doing = "writing a row"
            writer.log_metrics(row, step)
        if failure.error is not None:
            self.stop(failure.error, doing)

    def log_telemetry(self, row: Mapping[str, float], step: int) -> None:
        """Write one telemetry row (its ``telemetry/*`` columns as they are)."""
        if self.stopped:
            return
        with guarded() as failure:
            writer = self._writer if self._writer is not None else self.writer
            writer.log_columns(row, step)
        if failure.error is not None:
            self.stop(failure.error, "writing a telemetry row")

    def flush(self) -> None:
        """Write the buffered rows now, if the file was opened."""
        writer = _OPEN_WRITERS.get(self.path)
        if writer is None or self.stopped:
            return
        with guarded() as failure:
            writer.flush()
        if failure.error is not None:
            self.stop(failure.error, "writing rows")

    def close(self, failed: bool = False) -> None:
        """Flush, sync and close the file (the end of every stage)."""
        writer = _OPEN_WRITERS.pop(self.path, None)
        self._writer = None
        if writer is None or self.stopped:
            return
        with guarded() as failure:
            writer.close()
        if failure.error is not None:
            _OPEN_WRITERS[self.path] = writer  # so that stop reports its rows
            self.stop(failure.error, "closing the file")

    def abandon(self) -> None:
        """The CSV file is never abandoned: a failure of the local values stops it with :meth:`stop`."""

    def stop(self, error: Exception, doing: str) -> None:
        """Stop this rank's file: keep what can be kept, mark it incomplete, warn once."""
        self._writer = None
        writer = _OPEN_WRITERS.pop(self.path, None)

        def written() -> tuple[int, int | None]:
            return (0, None) if writer is None else (writer.rows_written, writer.last_step_written)

        # the rows buffered before the error, if the file still takes them
        self._output.stop(error, doing, writer.close if writer is not None else lambda: None, written)


@atexit.register
def _close_writers() -> None:
    for writer in _OPEN_WRITERS.values():
        with guarded():  # at exit: each file closed as far as it can be, none in the way of the others
            writer.close()
    _OPEN_WRITERS.clear()
