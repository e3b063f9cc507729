"""Random logging programs run under stock ``DDPStrategy`` and under lightning-ext (in rank pools), for the coalesced
sync's tests: what every rank and every file shows must be stock's.

A *program* says, per hook, which keys are logged and how (reduce op, ``on_step``/``on_epoch``, dtype, progress bar),
with every rank's value and batch size at each (epoch, batch). The hooks: the module's ``training_step`` and
``on_train_batch_end``, a callback's ``on_train_batch_end``, and ``validation_step``. Two more callbacks read
``trainer.callback_metrics`` in ``on_train_batch_end``, one before the logging callback in the list (it sees what the
module logged in ``training_step``) and one after it (it also sees what the logging callback logged in that same
hook); the test compares what each read, too.
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

HOOKS = ("training_step", "on_train_batch_end", "callback_on_train_batch_end", "validation_step")
_DTYPES = {"int": torch.int64, "int32": torch.int32, "float32": torch.float32, "float64": torch.float64}


def log_keys(module: L.LightningModule, keys: list[dict[str, Any]], batch_idx: int) -> dict[str, float]:
    """Log ``keys`` at this rank's (epoch, batch); returns what ``callback_metrics`` shows for each right after."""
    rank, epoch = module.global_rank, module.current_epoch
    seen = {}
    for key in keys:
        value = torch.tensor(key["values"][rank][epoch][batch_idx], dtype=_DTYPES[key["dtype"]])
        options = {option: key[option] for option in ("reduce_fx", "on_step", "on_epoch", "prog_bar")}
        if key["batch_sizes"] is not None:
            options["batch_size"] = key["batch_sizes"][rank][epoch][batch_idx]
        module.log(key["name"], value, sync_dist=True, **options)
        if key["on_step"]:
            seen[key["name"]] = _number(module.trainer.callback_metrics.get(key["name"] + "_step" * key["on_epoch"]))
    return seen


class ProgramModule(L.LightningModule):
    """Logs what ``program`` says in each hook; keeps what a read right after its own ``self.log`` saw."""

    def __init__(self, program: dict[str, Any]) -> None:
        super().__init__()
        self.program = program
        self.layer = torch.nn.Linear(2, 1)
        self.read_inside: list[dict[str, float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.read_inside.append(log_keys(self, self.program["training_step"], batch_idx))
        return self.layer(batch[0]).sum() * 0.0

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        log_keys(self, self.program["on_train_batch_end"], batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        log_keys(self, self.program["validation_step"], batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


class LoggingCallback(L.Callback):
    """Logs ``program["callback_on_train_batch_end"]`` through the module, from a callback."""

    def __init__(self, program: dict[str, Any]) -> None:
        self.program = program

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        log_keys(pl_module, self.program["callback_on_train_batch_end"], batch_idx)


class ReadingCallback(L.Callback):
    """Reads every ``callback_metrics`` value in ``on_train_batch_end`` (before or after the logging callback)."""

    def __init__(self) -> None:
        self.reads: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.reads.append({name: _number(value) for name, value in trainer.callback_metrics.items()})


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def fit(root: str, program: dict[str, Any], stock: bool, strategy_options: dict[str, Any] | None = None) -> dict:
    """One fit on this pool's ranks; returns everything a user can see of the logged values on this rank."""
    from lightning_ext import PolicyDDPStrategy

    world = dist.get_world_size()
    strategy: Any = "ddp" if stock else PolicyDDPStrategy(**(strategy_options or {}))
    reading, reading_after, module = ReadingCallback(), ReadingCallback(), ProgramModule(program)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_epochs=program["epochs"],
        logger=CSVLogger(root, version=0),
        log_every_n_steps=1,
        callbacks=[reading, LoggingCallback(program), reading_after],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    batches = program["batches"]
    train = DataLoader(TensorDataset(torch.zeros(batches, 2)), batch_size=1)
    val = DataLoader(TensorDataset(torch.zeros(batches, 2)), batch_size=1) if program["validation_step"] else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, train, val)
    rows: list[dict[str, str]] = []
    if trainer.is_global_zero:
        with open(os.path.join(root, "lightning_logs", "version_0", "metrics.csv"), newline="") as file:
            rows = list(csv.DictReader(file))
    return {
        "callback_metrics": {name: _number(value) for name, value in trainer.callback_metrics.items()},
        "logged_metrics": {name: _number(value) for name, value in trainer.logged_metrics.items()},
        "progress_bar_metrics": {name: float(value) for name, value in trainer.progress_bar_metrics.items()},
        "callback_reads": reading.reads,
        "callback_reads_after": reading_after.reads,
        "read_inside": module.read_inside,
        "unsynced_reads": [  # lightning-ext's warnings about reads inside the logging hook: first line, file, line
            (str(warning.message).splitlines()[0], warning.filename, warning.lineno)
            for warning in caught
            if type(warning.message).__name__ == "UnsyncedReadWarning"
        ],
        "csv": rows,
    }


FIRST, LAST = 2, 12  # the counted steps: from the end of batch FIRST to the end of batch LAST


class CountingCallback(L.Callback):
    """Counts the host-device synchronizations of every training step from batch ``first`` to batch ``last``."""

    def __init__(self, first: int, last: int) -> None:
        from benchmarks.helpers.host_syncs import count_host_syncs

        self.first, self.last, self.counting = first, last, count_host_syncs()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.first:
            self.counting.__enter__()
        elif batch_idx == self.last:
            self.counting.__exit__(None, None, None)


class FiveValues(L.LightningModule):
    """Logs five synced float32 step values in ``training_step``."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        for index in range(5):
            self.log(f"value_{index}", loss.detach() * (index + 1), sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def host_syncs_per_step(stock: bool, strategy_options: dict[str, Any] | None = None, device: str = "cpu") -> float:
    """The host-device synchronizations per training step of a fit that logs five synced values per step.

    ``device="cuda"``: every rank trains on ``cuda:0`` (one lent GPU), the pool's gloo group all-reducing CUDA tensors;
    each rank is then a one-device node to Lightning (``num_nodes`` ranks, ``NODE_RANK`` its rank).
    """
    world = dist.get_world_size()
    layout: dict[str, Any] = {"accelerator": "cpu", "devices": world}
    environment = {}
    if device == "cuda":
        layout = {"accelerator": "gpu", "devices": [0], "num_nodes": world}
        environment = {"NODE_RANK": str(dist.get_rank()), "LOCAL_RANK": "0"}
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    try:
        counting = CountingCallback(FIRST, LAST)
        _counted_fit(stock, strategy_options, counting, FiveValues(), layout)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    from benchmarks.helpers.host_syncs import HOST_SYNC

    return counting.counting.counts[HOST_SYNC] / (LAST - FIRST)


class NValues(L.LightningModule):
    """Logs ``count`` synced float32 step values (``mean``) in ``training_step``."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        for index in range(self.count):
            self.log(f"value_{index}", loss.detach() * (index + 1), sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class CollectiveCounter(L.Callback):
    """Counts the ``torch.distributed`` calls of the training group and the checks, from one batch end to another."""

    def __init__(self, first: int, last: int) -> None:
        from benchmarks.helpers.collectives import count_collectives

        self.first, self.last = first, last
        self.counting = count_collectives()
        self.counts: dict[str, int] = {}

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.first:
            self.counts = self.counting.__enter__()
        elif batch_idx == self.last:
            self.counting.__exit__(None, None, None)


def collectives_per_step(stock: bool, count: int, strategy_options: dict[str, Any] | None = None) -> dict[str, float]:
    """Collective calls per training step, by name, of a fit that logs ``count`` synced values per step."""
    counting = CollectiveCounter(FIRST, LAST)
    layout = {"accelerator": "cpu", "devices": dist.get_world_size()}
    _counted_fit(stock, strategy_options, counting, NValues(count), layout)
    return {name: number / (LAST - FIRST) for name, number in counting.counts.items()}


def _counted_fit(
    stock: bool, options: dict[str, Any] | None, counting: L.Callback, module: L.LightningModule, layout: dict[str, Any]
) -> None:
    """A fit that counts from batch :data:`FIRST` to :data:`LAST` with ``counting``, under stock ``DDPStrategy`` or
    ``PolicyDDPStrategy(**options)``."""
    from lightning_ext import PolicyDDPStrategy

    trainer = L.Trainer(
        **layout,
        strategy="ddp" if stock else PolicyDDPStrategy(**(options or {})),
        max_steps=LAST + 2,
        logger=False,
        callbacks=[counting],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    # every rank's epoch outlasts the counted steps at any world size up to 4 (no epoch end's syncs among them)
    world = dist.get_world_size()
    trainer.fit(module, DataLoader(TensorDataset(torch.randn(32 * world, 2)), batch_size=2))
