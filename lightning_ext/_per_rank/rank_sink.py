"""The one interface of a rank's sinks (its CSV file, TensorBoard's events, MLflow's and W&B's runs), and what they
share: the names of metrics, the identity of a logger's main run, the stop that warns once."""

from collections.abc import Mapping
from typing import Protocol

from lightning_ext._files.csv_format import ESCAPE, TELEMETRY
from lightning_ext._files.file_output import Output
from lightning_ext.errors import RankMetricsWarning

__all__ = ["AFTERMATH", "Identity", "RankSink", "main_run", "metric_key", "sink_output", "telemetry_values"]

Identity = dict[str, str]  # a logger's main run as rank 0 made it (its id, ...), or {"error": why it could not}
AFTERMATH = "Training goes on; this rank's CSV file, its other loggers' runs and the other ranks are not affected."


class RankSink(Protocol):
    """One destination of this rank's rows; it never raises into the training.

    A failure makes it warn once (:func:`sink_output`'s ``step_aside``) and write nothing more in this process; the
    other sinks go on.
    """

    resume_from_step: int | None  # a resumed run's checkpoint step (rows after it are logged again), else None

    @property
    def stopped(self) -> bool:
        """It failed, or was abandoned: it writes nothing more."""

    def log_row(self, row: Mapping[str, float], step: int) -> None:
        """One logged row: this rank's local values, by the names the trainer's loggers get, at ``step``."""

    def log_telemetry(self, row: Mapping[str, float], step: int) -> None:
        """One telemetry row (``telemetry/*`` columns, and ``epoch``)."""

    def flush(self) -> None:
        """Write what is buffered now."""

    def close(self, failed: bool) -> None:
        """The end of a stage: write what is buffered, end what the stage opened (``failed``: the stage raised)."""

    def abandon(self) -> None:
        """Close and write nothing more, quietly: the local values failed (the CSV file's warning says so)."""


def sink_output(key: str, owner: str) -> Output:
    """The stop-and-warn of a sink other than the CSV file: ``owner`` names it (``"Per-rank MLflow run of rank 1"``)."""
    return Output(key, owner=owner, warning=RankMetricsWarning, aftermath=AFTERMATH)


def metric_key(name: str, telemetry: bool) -> str:
    """A metric's name in a sink, as in the CSV file: with telemetry on, a user's ``telemetry/...`` is escaped."""
    return ESCAPE + name if telemetry and name.startswith(TELEMETRY) else name


def telemetry_values(row: Mapping[str, float]) -> dict[str, float]:
    """A telemetry row's ``telemetry/*`` values (its ``epoch`` is already in the metric rows)."""
    return {name: value for name, value in row.items() if name.startswith(TELEMETRY)}


def main_run(identity: Identity | None) -> Identity:
    """The logger's main run, as rank 0 handed it over at set-up.

    Raises:
        RuntimeError: rank 0 could not make it (the error is named), or handed over none.

    """
    if identity is None:
        raise RuntimeError("rank 0 handed over no main run for this logger")
    if "error" in identity:
        raise RuntimeError(f"rank 0 could not make the logger's main run: {identity['error']}")
    return identity
