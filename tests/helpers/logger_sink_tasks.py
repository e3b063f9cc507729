"""``Trainer.fit`` runs with the loggers users pick (MLflow, W&B, TensorBoard in any place), on every rank of a pool.

Each rank logs, per step, ``loss`` (synced, step and epoch) and ``own`` (not synced). Rank ``r``'s value at (epoch
``e``, batch ``b``) is ``100 e + 10 r + b``; the parent derives every expected value from that formula
(:func:`expected`), not from the code under test. The loggers' stores live under the test's ``root``: MLflow's file
store (``MLFLOW_ALLOW_FILE_STORE=true``, as ``mlflow-skinny`` has no SQL store), W&B in offline mode (``WANDB_MODE``).
A fault on one rank: ``"mlflow_unwritable"`` (its MLflow metric files refuse writes after a few: EACCES).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from lightning_ext import PerRankMetrics, PolicyDDPStrategy
from lightning_ext.rank_metrics import RankMetricsWarning

EPOCHS, BATCHES, VERSION = 2, 3, "v"
ENVIRONMENT = {"MLFLOW_ALLOW_FILE_STORE": "true", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        value = torch.tensor(100.0 * self.current_epoch + 10 * self.global_rank + batch_idx)
        self.log("loss", value, on_step=True, on_epoch=True, sync_dist=True)
        self.log("own", value + 0.5, on_step=True, on_epoch=False)
        return self.layer(batch[0]).sum() * 0.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _loggers(root: str, names: list[str]) -> list[Any]:
    made: dict[str, Any] = {
        "csv": lambda: CSVLogger(root, version=VERSION),
        "tensorboard": lambda: TensorBoardLogger(root, name="tb", version=VERSION),  # not the CSV files' directory
        "mlflow": lambda: MLFlowLogger(experiment_name="ranks", tracking_uri=f"file:{root}/mlruns"),
        "wandb": lambda: WandbLogger(project="ranks", save_dir=root),
    }
    return [made[name]() for name in names]


def fit(root: str, loggers: list[str], *, stock: bool = False, fault: str | None = None, flush_every: int = 2) -> dict:
    """Fit on this rank with ``loggers`` (in that order); returns how it ended, its warnings and its loggers' runs."""
    rank = dist.get_rank()
    with _environment(ENVIRONMENT), _unwritable(f"{root}/mlruns") if fault and rank == 1 else nullcontext():
        chosen = _loggers(root, loggers)
        options = PerRankMetrics(flush_every_n_rows=flush_every)
        strategy = DDPStrategy() if stock else PolicyDDPStrategy(per_rank_metrics=options, hang_checks=False)
        trainer = L.Trainer(
            accelerator="cpu",
            devices=dist.get_world_size(),
            strategy=strategy,
            max_epochs=EPOCHS,
            logger=chosen,
            log_every_n_steps=1,
            default_root_dir=root,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        data = DataLoader(TensorDataset(torch.zeros(BATCHES * dist.get_world_size(), 2)), batch_size=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(Model(), data)
        runs = {}
        for name, logger in zip(loggers, chosen):
            if name == "mlflow" and rank == 0:
                runs[name] = {"run_id": logger.run_id, "experiment_id": logger.experiment_id}
            elif name == "wandb" and rank == 0:
                runs[name] = {"id": logger.experiment.id}
                logger.experiment.finish()  # as a script's end does: the main run's log is complete
            elif name in ("csv", "tensorboard"):
                runs[name] = {"log_dir": logger.log_dir}
    return {
        "rank": rank,
        "status": trainer.state.status.value,
        "global_step": trainer.global_step,
        "log_dir": trainer.log_dir,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, RankMetricsWarning)],
        "runs": runs,
    }


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _unwritable(store: str, allowed: int = 6) -> Iterator[None]:
    """Opening a metric file of the MLflow store under ``store`` for writing fails with EACCES after ``allowed``
    opens (the file store opens one per metric value: 6 is the first two rows' ``loss_step``, ``own``, ``epoch``): the
    tracking directory turned unwritable mid-run (root ignores a chmod, so the refusal is injected)."""
    real_open = builtins.open
    directory = os.path.abspath(store)
    seen = [0]

    def open_(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        full = os.path.abspath(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
        if full.startswith(directory) and f"{os.sep}metrics{os.sep}" in full and mode[0] in "aw":
            seen[0] += 1
            if seen[0] > allowed:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), full)
        return real_open(path, mode, *args, **kwargs)

    builtins.open = io.open = open_  # type: ignore[assignment]
    try:
        yield
    finally:
        builtins.open = io.open = real_open  # type: ignore[assignment]


# ---- the parent's side: the expected values, from the formula above --------------------------------------------------


def expected(rank: int) -> dict[str, list[tuple[int, float]]]:
    """Rank ``rank``'s own values by key, ``(step, value)`` in the order logged (what its per-rank runs must hold)."""
    found: dict[str, list[tuple[int, float]]] = {"loss_step": [], "own": [], "loss_epoch": []}
    for epoch in range(EPOCHS):
        values = [100.0 * epoch + 10 * rank + batch for batch in range(BATCHES)]
        for batch, value in enumerate(values):
            found["loss_step"].append((epoch * BATCHES + batch, value))
            found["own"].append((epoch * BATCHES + batch, value + 0.5))
        found["loss_epoch"].append(((epoch + 1) * BATCHES - 1, sum(values) / BATCHES))
    return found


def synced(world: int) -> dict[str, list[tuple[int, float]]]:
    """What rank 0's stock loggers hold: ``loss`` synced (the mean over the ranks), ``own`` rank 0's own."""
    ranks = [expected(rank) for rank in range(world)]
    means = {
        key: [(points[0][0], sum(value for _, value in points) / world) for points in zip(*(r[key] for r in ranks))]
        for key in ("loss_step", "loss_epoch")
    }
    return {**means, "own": ranks[0]["own"]}
