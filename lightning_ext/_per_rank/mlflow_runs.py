"""Each rank's MLflow run: a child run ``rank_<r>`` under the ``MLFlowLogger``'s run (tag ``mlflow.parentRunId``).

The same keys (the logger's prefix, its character rule), steps and tracking URI as the logger; rows are sent in batches,
by the rule of :mod:`~lightning_ext._per_rank.held_rows`, from a thread of the sink. See the per-rank docs.
"""

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger

from lightning_ext._files.file_output import Output
from lightning_ext._files.storage import guarded
from lightning_ext._per_rank.rank_sink import Identity, main_run, metric_key, sink_output, telemetry_values
from lightning_ext._per_rank.sender import Sender
from lightning_ext._per_rank.writer import PerRankMetrics

__all__ = ["PARENT_TAG", "RankMlflowRun", "identity", "sink_for"]

PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag: the UI nests a run under the run it names
_BATCH_LIMIT = 1000  # metrics per log_batch request: MLflow's limit
_NOT_ALLOWED = re.compile("[^a-zA-Z0-9_/. -]+")  # MLFlowLogger.log_metrics removes these characters from a key
_CHILDREN: dict[tuple[str, str, int], str] = {}  # (tracking URI, parent run, rank): its child made in this process


def identity(logger: MLFlowLogger) -> Identity:
    """The logger's run as rank 0 has it (made now if it was not yet; stock Lightning's set-up hook makes it too)."""
    resumed = logger._run_id is not None and not logger._initialized  # the user named a run to log to again
    return {
        "run_id": str(logger.run_id),
        "experiment_id": str(logger.experiment_id),
        "tracking_uri": str(logger._tracking_uri),
        "resumed": "yes" if resumed else "",
    }


def sink_for(logger: MLFlowLogger, rank: int, options: PerRankMetrics, main: Identity | None) -> "RankMlflowRun | None":
    """This rank's child run of ``logger``'s run, or ``None`` (said once) where it cannot be made."""
    where = "?" if main is None else f"{main.get('run_id', '?')} at {main.get('tracking_uri', '?')}"
    output = sink_output(f"mlflow run of rank {rank} under {where}", f"Per-rank MLflow run of rank {rank}")
    if output.stopped:  # it failed earlier in this process, and said so then
        return None
    nothing = "No per-rank MLflow run is made on this rank"
    with guarded() as failure:  # the optional package: absent (ImportError), or a broken install
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient
    if failure.error is not None:
        output.step_aside(
            failure.error, "loading mlflow", lambda _: f"{nothing}; `pip install 'lightning-ext[mlflow]'`"
        )
        return None
    try:
        main = main_run(main)
    except RuntimeError as error:
        output.step_aside(error, "naming the parent run", lambda _: nothing)
        return None
    prefix = f"{logger._prefix}{logger.LOGGER_JOIN_CHAR}" if logger._prefix else ""
    client = MlflowClient(main["tracking_uri"])
    run = RankMlflowRun(
        output,
        main,
        rank,
        client,
        Metric,
        prefix=prefix,
        telemetry=options.telemetry,
        every_n_rows=options.flush_every_n_rows,
    )
    run.open()
    return run


class RankMlflowRun:
    """This rank's child run; never raises into the training.

    Args:
        output: its stop-and-warn.
        main: the logger's run, from rank 0 (``run_id``, ``experiment_id``, ``tracking_uri``, ``resumed``).
        rank: this process's global rank.
        client: an ``MlflowClient`` for the tracking URI.
        metric: MLflow's ``Metric`` class.
        prefix: the logger's prefix and join character, put before each key as the logger does.
        telemetry: telemetry is on: a user's ``telemetry/...`` metric is escaped, as in the CSV file.
        every_n_rows: rows held before they are sent (the per-rank ``flush_every_n_rows``).

    """

    def __init__(
        self,
        output: Output,
        main: Identity,
        rank: int,
        client: Any,
        metric: Any,
        *,
        prefix: str,
        telemetry: bool,
        every_n_rows: int,
    ) -> None:
        self._output, self._main, self._rank = output, main, rank
        self._client, self._metric, self._prefix = client, metric, prefix
        self.stopped = False
        self.resume_from_step: int | None = None  # MLflow keeps a metric's whole history: nothing is dropped
        self.telemetry = telemetry
        self.run_id: str | None = None
        self._keys: dict[str, str] = {}
        self._every_n_rows = every_n_rows
        self._sender: Sender[list[Any], list[Any]] | None = None  # each row's metrics; each request's metrics

    def open(self) -> None:
        """Find or make the child run (at set-up: one request, or two when the parent run was resumed)."""
        main, rank = self._main, self._rank
        key = (main["tracking_uri"], main["run_id"], rank)
        with guarded() as failure:
            run_id = _CHILDREN.get(key) or (self._find() if main["resumed"] else None)
            if run_id is None:
                tags = {PARENT_TAG: main["run_id"], "rank": str(rank)}
                made = self._client.create_run(main["experiment_id"], run_name=f"rank_{rank}", tags=tags)
                run_id = made.info.run_id
            _CHILDREN[key] = self.run_id = run_id
            client = self._client
            # a request is a file write per value on a file store, a round trip to a tracking server: a thread's
            self._sender = Sender(
                lambda metrics: client.log_batch(run_id, metrics=metrics),
                _requests,
                client="MLflow's client",
                name=f"lightning-ext MLflow rank {rank}",
                every_n_rows=self._every_n_rows,
            )
        if failure.error is not None:
            self._stop(failure.error, "making the child run")

    def log_row(self, row: Mapping[str, float], step: int) -> None:
        """Queue the row's values at ``step``; send the queue when it is due."""
        self._queue(row, step, self._key)

    def log_telemetry(self, row: Mapping[str, float], step: int) -> None:
        """Queue a telemetry row's ``telemetry/*`` values."""
        self._queue(telemetry_values(row), step, lambda name: self._prefix + name)

    def flush(self) -> None:
        """Hand the values held to the sender, and wait until they are sent (30 s at most)."""
        sender = self._sender
        error = None if self.stopped or sender is None else sender.flush()
        if error is not None:
            self._stop(error, "sending rows")

    def close(self, failed: bool) -> None:
        """Send what is held and mark the child run ended (``FAILED`` if the stage raised); a later stage logs to it."""
        self.flush()
        sender, self._sender = self._sender, None
        if self.stopped or sender is None:
            return
        with guarded() as failure:
            sender.end()
            self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
        if failure.error is not None:
            self._stop(failure.error, "ending the child run")

    def abandon(self) -> None:
        """Write nothing more (the values held so far are local values: they are sent)."""
        sender, self._sender = self._sender, None
        if not self.stopped and sender is not None:
            with guarded():  # the CSV file's warning says that this rank's output stopped
                sender.hand_on()
                sender.end()
                self._client.set_terminated(self.run_id, "FAILED")
        self.stopped = True

    def _key(self, name: str) -> str:
        key = self._keys.get(name)
        if key is None:
            key = self._keys[name] = _NOT_ALLOWED.sub("", self._prefix + metric_key(name, self.telemetry))
        return key

    def _queue(self, values: Mapping[str, float], step: int, key: Callable[[str], str]) -> None:
        sender = self._sender
        if self.stopped or sender is None:
            return
        if sender.error is not None:
            self._stop(sender.error, "sending rows")
            return
        with guarded() as failure:
            stamp = int(time.time() * 1000)
            metric = self._metric
            sender.hold([metric(key(name), float(value), stamp, step) for name, value in values.items()])
        if failure.error is not None:
            self._stop(failure.error, "sending rows")

    def _find(self) -> str | None:
        """The child of rank ``rank`` that an earlier process made under the resumed parent run, if any."""
        main = self._main
        query = f"tags.`{PARENT_TAG}` = '{main['run_id']}' and tags.rank = '{self._rank}'"
        found = self._client.search_runs([main["experiment_id"]], filter_string=query, max_results=1)
        return str(found[0].info.run_id) if found else None

    def _stop(self, error: BaseException, doing: str) -> None:
        self.stopped = True
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.drop()
        run, where = self.run_id, self._main["tracking_uri"]
        kept = f"Its run {run} in {where} keeps the values sent so far" if run else f"No run was made in {where}"
        self._output.step_aside(error, doing, lambda _: kept, sender.end if sender is not None else lambda: None)


def _requests(rows: list[list[Any]]) -> list[list[Any]]:
    """Rows' metrics in requests of at most MLflow's limit."""
    pending = [metric for row in rows for metric in row]
    return [pending[start : start + _BATCH_LIMIT] for start in range(0, len(pending), _BATCH_LIMIT)]
