"""Fits that a preemption signal interrupts, and their uninterrupted stock references (rank pools and launched jobs).

Every rank trains a small model on its own fixed batches through a loader that resumes mid-epoch (Lightning's
``state_dict``/``load_state_dict`` protocol), so a resumed run sees exactly the data the uninterrupted one saw. Each
rank logs its local loss and ``mark(rank, step)`` every step; a plain callback records each rank's local loss per
step, which is the reference for the per-rank rows. The reference fit uses Lightning's stock ``DDPStrategy``.
"""

from __future__ import annotations

import csv
import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_ext import PerRankMetrics, PolicyDDPStrategy, PolicyModelParallelStrategy

TRAIN_BATCHES = 5
VAL_BATCHES = 2
EPOCHS = 2
PHASES = ("training_step", "on_train_batch_end", "validation_step")
SLOWED_STEP = 0.5  # seconds each training step takes from a signalled batch on (tests/preemption/test_preemption.py)
SLOW_VALIDATION = 1.0  # seconds each batch of a signalled validation takes (a stop within it has that long to come)


def mark(rank: int, step: int) -> float:
    """The value rank ``rank`` logs (un-synced) at training step ``step``."""
    return 1000.0 * rank + step


class Resumable:
    """``count`` fixed batches of this rank, resumable mid-epoch."""

    def __init__(self, seed: int, count: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.batches = [torch.randn(4, 3, generator=generator) for _ in range(count)]
        self.position = 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):  # type: ignore[no-untyped-def]
        if self.position >= len(self.batches):
            self.position = 0
        for index in range(self.position, len(self.batches)):
            self.position = index + 1
            yield (self.batches[index],)

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


class Model(L.LightningModule):
    """Sends itself SIGTERM at ``signals[rank] = (batch, phase)``: in that training batch or the validation after it."""

    def __init__(
        self, signals: dict[int, tuple[int, str]] | None = None, fail: tuple[int, int] | None = None, pause: float = 0.0
    ) -> None:
        super().__init__()
        self.pause = pause  # seconds each training step waits without the GIL, as a step's device work would
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)
        self.signals = signals or {}
        self.fail = fail  # (rank, batch): that rank raises ValueError in that training batch
        self.sent = False
        self.last_loss = 0.0
        self.val_batches = 0  # the current (or last) validation's completed batches
        self.validation_ended = False  # whether it ran to its end

    def _maybe_signal(self, phase: str) -> None:
        wanted = self.signals.get(self.global_rank)
        batch = self.trainer.fit_loop.epoch_loop.batch_progress.total.ready - 1  # the training batch just started
        if wanted is not None and not self.sent and wanted == (batch, phase):
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        # before the synced log, where the other ranks wait at a lightning-ext check (a rank pool's failed rank stays
        # alive, so a rank blocked in a gloo collective with it would never be released)
        if self.fail == (self.global_rank, self.trainer.fit_loop.epoch_loop.batch_progress.total.ready - 1):
            raise ValueError(f"boom on rank {self.global_rank}")
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss, sync_dist=True)
        self.log("mark", mark(self.global_rank, self.trainer.fit_loop.epoch_loop._batches_that_stepped))
        self.last_loss = float(loss.detach())
        self._maybe_signal("training_step")
        batch_now = self.trainer.fit_loop.epoch_loop.batch_progress.total.ready - 1
        signalled = any(batch_now >= batch for batch, _ in self.signals.values())
        # from the signalled batch on, on every rank, a step as long as a real one: the stop's agreement between the
        # watchdog threads then has LATENCY such steps however loaded the machine is (20 ms steps gave it 60 ms)
        time.sleep(SLOWED_STEP if signalled else self.pause)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._maybe_signal("on_train_batch_end")

    def on_validation_start(self) -> None:
        self.val_batches, self.validation_ended = 0, False

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.val_batches += 1

    def on_validation_end(self) -> None:
        self.validation_ended = True

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val", self.layer(batch[0]).mean(), sync_dist=True)
        if batch_idx == 0:
            self._maybe_signal("validation_step")
        batch_before = self.trainer.fit_loop.epoch_loop.batch_progress.total.ready - 1
        if (batch_before, "validation_step") in self.signals.values():  # on every rank: the stop comes within a batch
            time.sleep(SLOW_VALIDATION)

    def configure_model(self) -> None:
        if isinstance(self.trainer.strategy, ModelParallelStrategy) and not hasattr(self.layer.weight, "full_tensor"):
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])  # FSDP2

    def train_dataloader(self) -> Resumable:
        return Resumable(100 + self.global_rank, TRAIN_BATCHES)

    def val_dataloader(self) -> Resumable:
        return Resumable(200 + self.global_rank, VAL_BATCHES)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class LossRecorder(L.Callback):
    """Each rank's local loss at each logging step (the reference for the per-rank rows)."""

    def __init__(self) -> None:
        self.losses: list[tuple[int, float]] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append((trainer.fit_loop.epoch_loop._batches_that_stepped, module.last_loss))


def trainer_for(root: str, strategy: Any, accumulate: int, checkpoint: str, callbacks: list[Any]) -> L.Trainer:
    """The trainer of every run (``checkpoint``: ``"save_last"`` or ``"default"``, Lightning's default callback)."""
    if checkpoint == "save_last":
        callbacks = [*callbacks, ModelCheckpoint(dirpath=os.path.join(root, "ckpt"), save_last=True, save_top_k=0)]
    return L.Trainer(
        accelerator="cpu",
        devices=_devices(),
        strategy=strategy,
        max_epochs=EPOCHS,
        val_check_interval=3,
        use_distributed_sampler=False,
        logger=CSVLogger(root, name="", version="run"),
        log_every_n_steps=1,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accumulate_grad_batches=accumulate,
    )


def _devices() -> int:
    """The processes per node: a rank pool's group size, one process under torchrun, else 2 (popen, spawn)."""
    if torch.distributed.is_initialized():  # a rank pool (Lightning's teardown deletes WORLD_SIZE from the env)
        return torch.distributed.get_world_size()
    return int(os.environ.get("LOCAL_WORLD_SIZE", "2"))


def weights(model: Model) -> list[float]:
    """The layer's weight and bias (whole, also when FSDP2 shards them)."""
    tensors = [parameter.detach() for parameter in (model.layer.weight, model.layer.bias)]
    return [
        value for tensor in tensors for value in getattr(tensor, "full_tensor", lambda t=tensor: t)().flatten().tolist()
    ]


def _strategy(kind: str, stock: bool, **options: Any) -> Any:
    """``"ddp"`` or ``"model_parallel"`` (FSDP2, data parallel over every rank), stock or lightning-ext's."""
    if kind == "model_parallel":
        shape = {"data_parallel_size": _devices(), "tensor_parallel_size": 1}
        return ModelParallelStrategy(**shape) if stock else PolicyModelParallelStrategy(**shape, **options)
    return (
        DDPStrategy(process_group_backend="gloo")
        if stock
        else PolicyDDPStrategy(process_group_backend="gloo", **options)
    )


def reference(root: str, accumulate: int, kind: str = "ddp") -> dict[str, Any]:
    """The uninterrupted stock run: final weights, steps, this rank's local loss per step."""
    recorder = LossRecorder()
    trainer = trainer_for(root, _strategy(kind, stock=True), accumulate, "default", [recorder])
    model = Model()
    trainer.fit(model)
    return {"weights": weights(model), "global_step": trainer.global_step, "losses": recorder.losses}


def ours(
    root: str,
    accumulate: int,
    checkpoint: str,
    policy: Any = "any",
    signals: dict[int, tuple[int, str]] | None = None,
    resume: bool = False,
    fail: tuple[int, int] | None = None,
    kind: str = "ddp",
    pause: float = 0.0,
    hang_checks: bool = True,
) -> dict[str, Any]:
    """A run with lightning-ext's strategy (per-rank rows on): signalled as ``signals`` says, or resumed from "last"."""
    strategy = _strategy(
        kind,
        stock=False,
        preemption_policy=policy,
        hang_checks=hang_checks,
        per_rank_metrics=PerRankMetrics(flush_every_n_rows=1000),  # rows stay buffered unless the stop flushes them
    )
    trainer = trainer_for(root, strategy, accumulate, checkpoint, [])
    model = Model(signals, fail, pause)
    outcome: dict[str, Any] = {"code": None, "error": None}
    try:
        trainer.fit(model, ckpt_path="last" if resume else None)
    except SIGTERMException as stop:
        outcome["code"] = stop.code
    except Exception as error:
        outcome["error"] = f"{type(error).__name__}: {error}"
    loop = trainer.fit_loop.epoch_loop
    outcome.update(
        weights=weights(model),
        global_step=trainer.global_step,
        batches=loop.batch_progress.total.completed,
        received_sigterm=trainer.received_sigterm,
        val_batches=model.val_batches,
        validation_ended=model.validation_ended,
    )
    return outcome


def rank_rows(root: str, rank: int) -> list[dict[str, str]]:
    """The rows of rank ``rank``'s own metrics file, read as plain CSV."""
    path = Path(root) / "run" / f"rank_{rank}" / "metrics.csv"
    with path.open() as handle:
        return list(csv.DictReader(handle))


def broadcasts_per_fit(root: str, stock: bool) -> int:
    """How many ``torch.distributed.broadcast`` calls one uninterrupted fit makes (stock or with the stop armed)."""
    calls = 0
    original = torch.distributed.broadcast

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    torch.distributed.broadcast = counted
    try:
        if stock:
            reference(root, 1)
        else:
            ours(root, 1, "default")
    finally:
        torch.distributed.broadcast = original
    return calls
