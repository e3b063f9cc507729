"""Per-rank metrics: a Lightning logger that writes each rank's local values to ``<log_dir>/rank_<r>/metrics.csv``.

``RankCSVLogger`` receives exactly the rows the trainer's loggers receive: the same keys, the same steps, the same
``epoch`` column. Before each row is written, every synced value is swapped for its local counterpart
(:mod:`lightning_ext._local_values`). Values that exist on rank 0 only (``rank_zero_only=True``) are left out of the
other ranks' files. The file format, buffering and crash safety are those of
:class:`~lightning_ext.rank_metrics.RankMetricsWriter`.

Where the trainer has loggers, this logger is appended to ``trainer.loggers`` for the run, so it also sees rows that
callbacks send to every logger (``LearningRateMonitor``). Where it has none, the logger connector's seam adds it for
each ``log_metrics`` call only, so nothing else changes (``trainer.logger`` stays ``None``). No collective
operation is involved: the directory is agreed at set-up, within the strategy's one set-up exchange.
"""

import atexit
import os
import sys
from typing import Any

from lightning.pytorch.loggers import Logger
from torch import Tensor
from typing_extensions import override

from lightning_ext._local_values import OMITTED, local_values_for
from lightning_ext.rank_metrics import PerRankMetrics, RankMetricsWriter

__all__ = ["RankCSVLogger", "loggers_for"]


_OPEN_WRITERS: dict[str, RankMetricsWriter] = {}
_WRITTEN_HERE: set[str] = set()  # files this process wrote: a later fit/validate/test here continues them


class RankCSVLogger(Logger):
    """Writes this rank's local values of every logged row to its own CSV file.

    Args:
        log_dir: the run's log directory, identical on every rank.
        rank: this process's global rank.
        options: file name template and flush interval.

    """

    def __init__(self, log_dir: str, rank: int, options: PerRankMetrics | None = None) -> None:
        super().__init__()
        self._log_dir = log_dir
        self._rank = rank
        self._options = options or PerRankMetrics()
        self._pending: dict[str, Tensor | object] = {}
        self._path = os.path.join(log_dir, self._options.filename.format(rank=rank))
        self._writer: RankMetricsWriter | None = None
        self.resume_from_step: int | None = None
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
    def experiment(self) -> RankMetricsWriter:
        """The writer of this rank's file, opened on first use.

        A run resumed from a checkpoint keeps the rows up to the checkpoint's step and drops the later ones (they are
        logged again). A later stage in the same process (``fit`` then ``test``) continues the file. A fresh run that
        finds a file from another process keeps it, renamed (see
        :class:`~lightning_ext.rank_metrics.RankMetricsWriter`).
        """
        writer = self._writer if self._writer is not None else _OPEN_WRITERS.get(self.path)
        if writer is None:
            resume = self.resume_from_step
            if resume is None and self.path in _WRITTEN_HERE:
                resume = sys.maxsize  # keep every row
            writer = RankMetricsWriter(
                self.path, flush_every_n_rows=self._options.flush_every_n_rows, resume_from_step=resume
            )
            _OPEN_WRITERS[self.path] = writer
            _WRITTEN_HERE.add(self.path)
        self._writer = writer
        return writer

    def expect(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """Remember the local counterparts of the synced values the connector is about to log."""
        results = trainer._results
        if results is None:
            self._pending = {}
            return
        on_step = trainer._logger_connector._first_loop_iter is not None  # as _LoggerConnector.metrics decides
        self._pending = local_values_for(results, on_step, metrics)

    @override
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pending, self._pending = self._pending, {}
        row: dict[str, float] = {}
        for key, value in metrics.items():
            local = pending.get(key)
            if local is OMITTED:
                continue
            row[key] = local.item() if isinstance(local, Tensor) else value
        if step is None:
            raise ValueError("RankCSVLogger needs the step of every row (the trainer always passes it)")
        self.experiment.log_metrics(row, step)
        self.rows_logged += 1

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
        writer = _OPEN_WRITERS.get(self.path)
        if writer is not None:
            writer.flush()

    def close(self) -> None:
        """Flush, sync and close this rank's file (the strategy's teardown calls it at the end of every stage)."""
        writer = _OPEN_WRITERS.pop(self.path, None)
        self._writer = None
        if writer is not None:
            writer.close()


def loggers_for(trainer: Any, metrics: dict[str, Any]) -> list[Logger]:
    """The loggers one ``log_metrics`` call must reach: the trainer's, plus this rank's per-rank logger.

    The logger connector's seam calls this before it logs a row (see :mod:`lightning_ext._runtime`).
    """
    loggers: list[Logger] = list(trainer.loggers)
    rank_logger: RankCSVLogger | None = getattr(trainer.strategy, "rank_metrics_logger", None)
    if rank_logger is None:
        return loggers
    rank_logger.expect(trainer, metrics)
    if rank_logger not in loggers:
        loggers.append(rank_logger)
    return loggers


@atexit.register
def _close_writers() -> None:
    for writer in _OPEN_WRITERS.values():
        writer.close()
    _OPEN_WRITERS.clear()
