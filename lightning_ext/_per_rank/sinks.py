"""Which sinks a rank's rows go to besides its CSV file: one per logger of the trainer that has one, whatever its place
(TensorBoard's event files, MLflow's child runs, W&B's grouped runs), and the main runs rank 0 names at set-up."""

from collections.abc import Callable
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

from lightning_ext._files.storage import guarded
from lightning_ext._per_rank import mlflow_runs, tensorboard_files, wandb_runs
from lightning_ext._per_rank.rank_sink import Identity, RankSink
from lightning_ext._per_rank.writer import PerRankMetrics

__all__ = ["run_identities", "sinks_for"]


def run_identities(trainer: Any) -> list[Identity | None]:
    """On rank 0, at set-up: the main run of each of the trainer's loggers that the ranks' sinks name, by position.

    The runs are made now, W&B's first, as Lightning's set-up hook does right after (stock makes them there anyway). A
    failure is handed on, for every rank's sink to say why; it is never raised here, where the other ranks wait in the
    set-up's gather (Lightning's set-up hook then raises it on rank 0, as stock does).
    """
    loggers = [] if trainer is None else list(enumerate(trainer.loggers))
    found: list[Identity | None] = [None] * len(loggers)
    for index, logger in sorted(loggers, key=lambda pair: not isinstance(pair[1], WandbLogger)):
        identity = _identity_of(logger)
        if identity is not None:
            with guarded() as failure:
                found[index] = identity(logger)
            if failure.error is not None:
                found[index] = {"error": f"{type(failure.error).__name__}: {failure.error}"}
    return found


def _identity_of(logger: Any) -> Callable[[Any], Identity] | None:
    if isinstance(logger, MLFlowLogger):
        return mlflow_runs.identity
    if isinstance(logger, WandbLogger):
        return wandb_runs.identity
    return None


def sinks_for(
    trainer: Any, rank: int, options: PerRankMetrics, identities: list[Identity | None] | None
) -> list[RankSink]:
    """This rank's sinks: one per logger of the trainer that has one and whose switch is on, in the loggers' order.

    Args:
        trainer: the run's trainer.
        rank: this process's global rank.
        options: the per-rank options (``tensorboard``, ``mlflow``, ``wandb``, ``telemetry``, ...).
        identities: rank 0's :func:`run_identities`, from the set-up agreement.

    """
    sinks: list[RankSink | None] = []
    directories: set[str] = set()  # TensorBoard loggers that share a log_dir share its event files
    for index, logger in enumerate(trainer.loggers):
        identity = identities[index] if identities is not None and index < len(identities) else None
        if isinstance(logger, TensorBoardLogger) and options.tensorboard:
            sinks.append(tensorboard_files.sink_for(logger, rank, options, directories))
        elif isinstance(logger, MLFlowLogger) and options.mlflow:
            sinks.append(mlflow_runs.sink_for(logger, rank, options, identity))
        elif isinstance(logger, WandbLogger) and options.wandb:
            sinks.append(wandb_runs.sink_for(logger, rank, options, identity))
    return [sink for sink in sinks if sink is not None]
