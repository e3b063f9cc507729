"""``RankMetricsLogger``: the logger that hands each rank's local values to its sinks (its CSV file, and one per logger
of the trainer that has one); it never stops a run."""

from collections.abc import Sequence
from typing import Any

from lightning.pytorch.loggers import Logger
from torch import Tensor
from typing_extensions import override

from lightning_ext._files.storage import guarded
from lightning_ext._per_rank import local_values
from lightning_ext._per_rank.csv_file import RankCSVFile
from lightning_ext._per_rank.local_values import OMITTED, local_values_for
from lightning_ext._per_rank.rank_sink import RankSink
from lightning_ext._per_rank.writer import PerRankMetrics, RankMetricsWriter

__all__ = ["RankMetricsLogger", "loggers_for"]

_NOTHING: dict[str, Any] = {}


class RankMetricsLogger(Logger):
    """Writes this rank's local values of every logged row to its CSV file and its other sinks; never raises.

    Each sink steps aside alone on its own failure (one warning); a failure of the local values themselves stops them
    all (the CSV file's warning and marker say so: the others would get synced values).

    Args:
        log_dir: the run's log directory (a path or an fsspec URL), identical on every rank.
        rank: this process's global rank.
        options: file name template, flush interval, telemetry.
        sinks: this rank's other sinks (TensorBoard's events, MLflow's and W&B's runs), which get every row too.

    """

    def __init__(
        self, log_dir: str, rank: int, options: PerRankMetrics | None = None, sinks: Sequence[RankSink] = ()
    ) -> None:
        super().__init__()
        self._log_dir = log_dir
        self._rank = rank
        self._options = options or PerRankMetrics()
        self._pending: dict[str, Any] = _NOTHING
        self.csv = RankCSVFile(log_dir, rank, self._options)
        self.sinks: list[RankSink] = [self.csv, *sinks]
        self._live = [sink for sink in self.sinks if not sink.stopped]  # the sinks still writing
        self._failed = False  # Lightning finalized the stage as failed
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
        """This rank's CSV file."""
        return self.csv.path

    @property
    def stopped(self) -> bool:
        """Whether every sink stopped (after errors): nothing is written any more."""
        return not self._live

    @property
    def resume_from_step(self) -> int | None:
        """The logging step a resumed run starts from: later rows are dropped from the file (they are logged again)."""
        return self.csv.resume_from_step

    @resume_from_step.setter
    def resume_from_step(self, step: int | None) -> None:
        for sink in self.sinks:
            sink.resume_from_step = step

    @property
    def experiment(self) -> RankMetricsWriter:
        """The writer of this rank's CSV file, opened on first use.

        A run resumed from a checkpoint keeps the rows up to the checkpoint's step and drops the later ones (they are
        logged again). A later stage in the same process (``fit`` then ``test``) continues the file. A fresh run that
        finds a file from another process keeps it, renamed (see
        :class:`~lightning_ext.rank_metrics.RankMetricsWriter`). An incomplete-marker left by an earlier run goes
        with its file; a resume that logs every missing row again removes it.
        """
        return self.csv.writer

    def expect(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """Remember the local counterparts of the synced values the connector is about to log."""
        if not self._live:
            return
        with guarded() as failure:
            error = local_values.capture_error()
            if error is not None:
                self._values_failed(error, "capturing a local value")
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
            self._values_failed(failure.error, "computing a local value")

    @override
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        live = self._live
        if not live:
            return
        pending, self._pending = self._pending, _NOTHING
        if step is None:  # the trainer always passes it
            error = ValueError("RankMetricsLogger needs the step of every row (the trainer always passes it)")
            self._values_failed(error, "reading the local values")
            return
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
        if failure.error is not None:
            self._values_failed(failure.error, "reading the local values")
            return
        for sink in live:
            sink.log_row(row, step)
        self.rows_logged += 1
        self._drop_stopped()

    def log_telemetry(self, row: dict[str, float | int], step: int) -> None:
        """Write one row of per-rank telemetry (``telemetry/*`` columns) to every sink; a failure stops the sink that
        failed, as any row's would."""
        live = self._live
        for sink in live:
            sink.log_telemetry(row, step)
        if live:
            self.rows_logged += 1
            self._drop_stopped()

    @override
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Hyperparameters are the same on every rank: the trainer's own loggers keep them."""

    @override
    def save(self) -> None:
        """Rows are written every ``flush_every_n_rows`` rows, not on every call (that is what keeps it cheap)."""

    @override
    def finalize(self, status: str) -> None:
        self._failed = status == "failed"  # Lightning finalizes a failed stage before the strategy's teardown
        self.flush()

    def flush(self) -> None:
        """Write every sink's buffered rows now."""
        for sink in self._live:
            sink.flush()
        self._drop_stopped()

    def close(self) -> None:
        """Flush and close every sink (the strategy's teardown calls it at the end of every stage)."""
        if self._live and (error := local_values.capture_error()) is not None:
            self._values_failed(error, "capturing a local value")
        for sink in self.sinks:
            sink.close(self._failed)
        self._drop_stopped()

    def _values_failed(self, error: Exception, doing: str) -> None:
        """The local values failed: every sink stops (they would get synced values); the CSV file says why."""
        local_values.stop_capture()
        for sink in self.sinks:
            if sink is not self.csv and not sink.stopped:
                sink.abandon()
        if not self.csv.stopped:
            self.csv.stop(error, doing)
        self._live = []

    def _drop_stopped(self) -> None:
        live = self._live
        if any(sink.stopped for sink in live):
            self._live = live = [sink for sink in live if not sink.stopped]
            if not live:
                local_values.stop_capture()


def loggers_for(trainer: Any, metrics: dict[str, Any]) -> list[Logger]:
    """The loggers one ``log_metrics`` call must reach: the trainer's, plus this rank's per-rank logger.

    The logger connector's seam calls this before it logs a row (see :mod:`lightning_ext.strategies._runtime`).
    """
    loggers: list[Logger] = trainer.loggers
    rank_logger: RankMetricsLogger | None = getattr(trainer.strategy, "rank_metrics_logger", None)
    if rank_logger is None or rank_logger.stopped:
        return loggers
    rank_logger.expect(trainer, metrics)
    if rank_logger in loggers:
        return loggers
    return [*loggers, rank_logger]
