"""``RankCSVLogger``: the logger that writes each rank's local values to its own file; it never stops a run."""

import atexit
from typing import Any

from lightning.pytorch.loggers import Logger
from torch import Tensor
from typing_extensions import override

from lightning_ext._files.csv_format import TELEMETRY
from lightning_ext._files.file_output import FileOutput
from lightning_ext._files.storage import guarded
from lightning_ext._per_rank import local_values
from lightning_ext._per_rank.local_values import OMITTED, local_values_for
from lightning_ext._per_rank.tensorboard_files import RankEventFiles
from lightning_ext._per_rank.writer import PerRankMetrics, RankMetricsWriter
from lightning_ext.errors import RankMetricsWarning

__all__ = ["RankCSVLogger", "loggers_for"]


_OPEN_WRITERS: dict[str, RankMetricsWriter] = {}
_NOTHING: dict[str, Any] = {}


class RankCSVLogger(Logger):
    """Writes this rank's local values of every logged row to its own CSV file; never raises into the training.

    Args:
        log_dir: the run's log directory (a path or an fsspec URL), identical on every rank.
        rank: this process's global rank.
        options: file name template and flush interval.
        events: this rank's TensorBoard event files, which get every row too (when the first logger is TensorBoard's).

    """

    def __init__(
        self, log_dir: str, rank: int, options: PerRankMetrics | None = None, events: RankEventFiles | None = None
    ) -> None:
        super().__init__()
        self._log_dir = log_dir
        self._rank = rank
        self._options = options or PerRankMetrics()
        self._pending: dict[str, Any] = _NOTHING
        self._output = FileOutput(
            log_dir,
            self._options.filename,
            rank,
            owner=f"Per-rank metrics of rank {rank}",
            unit="row(s)",
            warning=RankMetricsWarning,
            aftermath="Training goes on; the other ranks' files are not affected.",
        )
        self._path = self._output.path
        self._writer: RankMetricsWriter | None = None
        self.events = events
        # trainer._results walks several properties; the collection it returns is fixed per (fn, stage): keep the last
        self._results: tuple[Any, Any, Any] = (None, None, None)
        self.rows_logged = 0

    @property
    @override
    def name(self) -> str:
        return "rank_metrics"

    @property
    @override
    def version(self) -> int:
        return self._rank

    @property
    @override
    def save_dir(self) -> str:
        return self._log_dir

    @property
    @override
    def log_dir(self) -> str:
        return self._log_dir

    @property
    def path(self) -> str:
        """This rank's file."""
        return self._path

    @property
    def stopped(self) -> bool:
        """Whether this rank's output stopped after an error (see the module docstring)."""
        return self._output.stopped

    @property
    def resume_from_step(self) -> int | None:
        """The logging step a resumed run starts from: later rows are dropped from the file (they are logged again)."""
        return self._output.resume_from_step

    @resume_from_step.setter
    def resume_from_step(self, step: int | None) -> None:
        self._output.resume_from_step = step

    @property
    def experiment(self) -> RankMetricsWriter:
        """The writer of this rank's file, opened on first use.

        A run resumed from a checkpoint keeps the rows up to the checkpoint's step and drops the later ones (they are
        logged again). A later stage in the same process (``fit`` then ``test``) continues the file. A fresh run that
        finds a file from another process keeps it, renamed (see
        :class:`~lightning_ext.rank_metrics.RankMetricsWriter`). An incomplete-marker left by an earlier run goes
        with its file; a resume that logs every missing row again removes it.
        """
        writer = self._writer if self._writer is not None else _OPEN_WRITERS.get(self._path)
        if writer is None:
            writer = self._output.open(self._new_writer, lambda opened: opened.rotated_to)
        self._writer = writer
        return writer

    def _new_writer(self, resume_from_step: int | None) -> RankMetricsWriter:
        options = self._options
        writer = RankMetricsWriter(
            self._path, flush_every_n_rows=options.flush_every_n_rows, resume_from_step=resume_from_step
        )
        if options.telemetry:
            writer.reserve(TELEMETRY)  # a user's metric named telemetry/... goes to metric:telemetry/...
        _OPEN_WRITERS[self._path] = writer  # before the marker is settled: a failure there closes it (_stop)
        return writer

    def expect(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """Remember the local counterparts of the synced values the connector is about to log."""
        if self.stopped:
            return
        with guarded() as failure:
            error = local_values.capture_error()
            if error is not None:
                self._stop(error, "capturing a local value")
                return
            state = trainer.state
            fn, stage, results = self._results
            if state.fn is not fn or state.stage is not stage or results is None:
                results = trainer._results
                if results is None:
                    self._pending = _NOTHING
                    return
                self._results = (state.fn, state.stage, results)
            on_step = trainer._logger_connector._first_loop_iter is not None  # as _LoggerConnector.metrics decides
            self._pending = local_values_for(results, on_step, metrics)
        if failure.error is not None:
            self._pending = _NOTHING
            self._stop(failure.error, "computing a local value")

    @override
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.stopped:
            return
        pending, self._pending = self._pending, _NOTHING
        doing = "reading the local values"
        with guarded() as failure:
            row = metrics
            if pending:
                row = dict(metrics)
                for key, local in pending.items():
                    if key in row:
                        if local is OMITTED:
                            del row[key]
                        else:
                            row[key] = local.item() if isinstance(local, Tensor) else local
            if step is None:
                raise ValueError("RankCSVLogger needs the step of every row (the trainer always passes it)")
            writer = self._writer
            if writer is None:
                doing = "opening the file"
                writer = self.experiment
            doing = "writing a row"
            writer.log_metrics(row, step)
            self.rows_logged += 1
            if self.events is not None:
                self.events.log_row(row, step, self.resume_from_step)
        if failure.error is not None:
            self._stop(failure.error, doing)

    def log_telemetry(self, row: dict[str, float | int], step: int) -> None:
        """Write one row of per-rank telemetry (``telemetry/*`` columns); a failure stops this rank's output as
        any row's would."""
        if self.stopped:
            return
        with guarded() as failure:
            writer = self._writer if self._writer is not None else self.experiment
            writer.log_columns(row, step)
            self.rows_logged += 1
            if self.events is not None:
                self.events.log_telemetry(row, step, self.resume_from_step)
        if failure.error is not None:
            self._stop(failure.error, "writing a telemetry row")

    @override
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Hyperparameters are the same on every rank: the trainer's own loggers keep them."""

    @override
    def save(self) -> None:
        """Rows are written every ``flush_every_n_rows`` rows, not on every call (that is what keeps it cheap)."""

    @override
    def finalize(self, status: str) -> None:
        self.flush()

    def flush(self) -> None:
        """Write the buffered rows now, if the file was opened."""
        writer = _OPEN_WRITERS.get(self._path)
        if writer is None or self.stopped:
            return
        if self.events is not None:
            self.events.flush()
        with guarded() as failure:
            writer.flush()
        if failure.error is not None:
            self._stop(failure.error, "writing rows")

    def close(self) -> None:
        """Flush, sync and close this rank's file (the strategy's teardown calls it at the end of every stage)."""
        if not self.stopped and (error := local_values.capture_error()) is not None:
            self._stop(error, "capturing a local value")
        writer = _OPEN_WRITERS.pop(self._path, None)
        self._writer = None
        if self.events is not None:
            self.events.close()
        if writer is None or self.stopped:
            return
        with guarded() as failure:
            writer.close()
        if failure.error is not None:
            _OPEN_WRITERS[self._path] = writer  # so that _stop reports its rows
            self._stop(failure.error, "closing the file")

    def _stop(self, error: Exception, doing: str) -> None:
        """Stop this rank's output: keep what can be kept, mark the file incomplete, warn once."""
        local_values.stop_capture()
        self._writer = None
        if self.events is not None:
            self.events.close()  # without local values the event files stop too
        writer = _OPEN_WRITERS.pop(self._path, None)

        def written() -> tuple[int, int | None]:
            return (0, None) if writer is None else (writer.rows_written, writer.last_step_written)

        # the rows buffered before the error, if the file still takes them
        self._output.stop(error, doing, writer.close if writer is not None else lambda: None, written)


def loggers_for(trainer: Any, metrics: dict[str, Any]) -> list[Logger]:
    """The loggers one ``log_metrics`` call must reach: the trainer's, plus this rank's per-rank logger.

    The logger connector's seam calls this before it logs a row (see :mod:`lightning_ext.strategies._runtime`).
    """
    loggers: list[Logger] = trainer.loggers
    rank_logger: RankCSVLogger | None = getattr(trainer.strategy, "rank_metrics_logger", None)
    if rank_logger is None or rank_logger.stopped:
        return loggers
    rank_logger.expect(trainer, metrics)
    if rank_logger in loggers:
        return loggers
    return [*loggers, rank_logger]


@atexit.register
def _close_writers() -> None:
    for writer in _OPEN_WRITERS.values():
        with guarded():  # at exit: each file closed as far as it can be, none in the way of the others
            writer.close()
    _OPEN_WRITERS.clear()
