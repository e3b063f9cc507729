"""A preemption notice during an evaluation (rank pools): fits that a SIGTERM interrupts in the sanity check or in a
validation, their resume, the uninterrupted stock reference, and ``validate``/``test``/``predict`` interrupted alike.

Every rank trains a bias-free linear layer on its own fixed batches (a loader that resumes mid-epoch) and validates on
its own batches, logging a synced value per validation batch and per validation. From the signalled batch on, every
rank's evaluation batches sleep ``SLOW`` seconds without the GIL, as a real batch's device work would: the stop must
come within one of them. The model records what the counters need: each validation run's completed batches, the
training batches started, each step's loss and each validation's synced value.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException

from tests.helpers.preemption_tasks import Resumable

TRAIN_BATCHES = 4
VAL_BATCHES = 6
SANITY = 2
EPOCHS = 2
VAL_EVERY = 2  # val_check_interval: a validation after training batches 2 and 4 of each epoch
SLOW = 1.5  # seconds each evaluation batch takes from the signalled one on

Signal = tuple[int, int, int]  # (rank, validation run, batch): run 0 is the sanity check


class Batches:
    """``count`` fixed batches of this rank, from the first at every iteration (a validation runs them all)."""

    def __init__(self, seed: int, count: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.batches = [(torch.randn(4, 3, generator=generator),) for _ in range(count)]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.batches)


class EvalModel(L.LightningModule):
    """Sends itself SIGTERM at ``signal`` (on that rank, in that validation run and batch) and slows down from there."""

    def __init__(self, signal_at: Signal | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1, bias=False)  # one parameter: DDP's one bucket sums alike after a resume
        self.signal_at = signal_at
        self.runs: list[list[Any]] = []  # each validation run: [sanity check?, batches completed]
        self.train_started = 0
        self.losses: list[tuple[int, float]] = []
        self.vals: list[tuple[int, float]] = []
        self.signal_time: float | None = None
        self.slow = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss, sync_dist=True)
        self.losses.append((self.global_step, float(loss.detach())))
        return loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.train_started += 1

    def on_validation_start(self) -> None:
        self.runs.append([self.trainer.sanity_checking, 0])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._maybe_signal(batch_idx)
        value = self.layer(batch[0]).mean()
        self.log("val_step", value, sync_dist=True, on_step=True, on_epoch=False)
        self.log("val", value, sync_dist=True)

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.runs[-1][1] += 1

    def on_validation_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.vals.append((self.global_step, float(self.trainer.callback_metrics["val"])))

    def _maybe_signal(self, batch_idx: int) -> None:
        wanted = self.signal_at
        if wanted is None:
            return
        rank, run, batch = wanted
        if (len(self.runs) - 1, batch_idx) == (run, batch):
            self.slow = True  # every rank, from this batch on
            if self.global_rank == rank:
                self.signal_time = time.monotonic()
                os.kill(os.getpid(), signal.SIGTERM)
        if self.slow:
            time.sleep(SLOW)

    def train_dataloader(self) -> Resumable:
        return Resumable(100 + self.global_rank, TRAIN_BATCHES)

    def val_dataloader(self) -> Batches:
        return Batches(200 + self.global_rank, VAL_BATCHES)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class EvalCounter(L.Callback):
    """Counts the training group's collective calls and the host-device synchronizations of validation batches 2 to
    ``VAL_BATCHES`` of the fit's first validation (after the sanity check)."""

    def __init__(self) -> None:
        from benchmarks.helpers.collectives import count_collectives
        from benchmarks.helpers.host_syncs import count_host_syncs

        self.collectives, self.host_syncs = count_collectives(), count_host_syncs()
        self.counts: dict[str, int] = {}
        self.entered = self.done = False

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        batch_idx = args[2] if len(args) > 2 else kwargs["batch_idx"]
        if trainer.sanity_checking or self.done:
            return
        if batch_idx == 0:
            self.counts = self.collectives.__enter__()
            self.host_syncs.__enter__()
            self.entered = True
        elif batch_idx == VAL_BATCHES - 1:
            self.host_syncs.__exit__(None, None, None)
            self.collectives.__exit__(None, None, None)
            self.counts = {**self.counts, **self.host_syncs.counts}
            self.done = True

    def close(self) -> None:
        """Stop counting if a stop came first (the pool's process goes on: ``torch.distributed`` must be its own)."""
        if self.entered and not self.done:
            with contextlib.suppress(Exception):
                self.host_syncs.__exit__(None, None, None)
            with contextlib.suppress(Exception):
                self.collectives.__exit__(None, None, None)
        self.done = True


def _trainer(root: str, strategy: Any, callbacks: list[L.Callback]) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=dist.get_world_size(),
        strategy=strategy,
        max_epochs=EPOCHS,
        val_check_interval=VAL_EVERY,
        num_sanity_val_steps=SANITY,
        use_distributed_sampler=False,
        logger=CSVLogger(root, name="", version="run"),
        log_every_n_steps=1,
        callbacks=[*callbacks, ModelCheckpoint(dirpath=os.path.join(root, "ckpt"), save_last=True, save_top_k=0)],
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _outcome(model: EvalModel, trainer: L.Trainer, **extra: Any) -> dict[str, Any]:
    return {
        "weights": model.layer.weight.detach().flatten().tolist(),
        "global_step": trainer.global_step,
        "losses": model.losses,
        "vals": model.vals,
        "runs": model.runs,
        "train_started": model.train_started,
        **extra,
    }


def reference(root: str) -> dict[str, Any]:
    """The uninterrupted stock run, and what its validation batches cost."""
    counter = EvalCounter()
    trainer = _trainer(root, DDPStrategy(process_group_backend="gloo"), [counter])
    model = EvalModel()
    try:
        trainer.fit(model)
    finally:
        counter.close()
    return _outcome(model, trainer, counts=counter.counts)


def ours(root: str, signal_at: Signal | None = None, resume: bool = False) -> dict[str, Any]:
    """lightning-ext's run, signalled at ``signal_at``, or resumed from "last" (and what its validation costs)."""
    from lightning_ext import PolicyDDPStrategy

    counter = EvalCounter()
    trainer = _trainer(root, PolicyDDPStrategy(process_group_backend="gloo"), [counter])
    model = EvalModel(signal_at)
    code = None
    try:
        trainer.fit(model, ckpt_path="last" if resume else None)
    except SIGTERMException as stop:
        code = stop.code
    finally:
        counter.close()
    return _outcome(
        model,
        trainer,
        code=code,
        stop_time=time.monotonic(),
        signal_time=model.signal_time,
        counts=counter.counts,
        received_sigterm=trainer.received_sigterm,
    )


class _Evaluated(L.LightningModule):
    """``validate``, ``test`` and ``predict``: ``VAL_BATCHES`` batches, SIGTERM at ``(rank, batch)``."""

    def __init__(self, signal_at: tuple[int, int]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1, bias=False)
        self.signal_at, self.completed, self.slow = signal_at, 0, False
        self.signal_time: float | None = None

    def _step(self, batch: Any, batch_idx: int, log: bool) -> torch.Tensor:
        rank, at = self.signal_at
        if batch_idx == at:
            self.slow = True
            if self.global_rank == rank:
                self.signal_time = time.monotonic()
                os.kill(os.getpid(), signal.SIGTERM)
        if self.slow:
            time.sleep(SLOW)
        value = self.layer(batch[0]).mean()
        if log:
            self.log("value", value, sync_dist=True, on_step=True)
        return value

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, batch_idx, log=True)

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, batch_idx, log=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, batch_idx, log=False)

    def on_validation_batch_end(self, *args: Any) -> None:
        self.completed += 1

    def on_test_batch_end(self, *args: Any) -> None:
        self.completed += 1

    def on_predict_batch_end(self, *args: Any) -> None:
        self.completed += 1

    def val_dataloader(self) -> Batches:
        return Batches(200 + self.global_rank, VAL_BATCHES)

    test_dataloader = predict_dataloader = val_dataloader


def evaluate(root: str, stage: str, signal_at: tuple[int, int]) -> dict[str, Any]:
    """``trainer.<stage>(model)``, SIGTERM to one rank at one batch: the error and batches each rank ended with."""
    from lightning_ext import PolicyDDPStrategy

    trainer = L.Trainer(
        accelerator="cpu",
        devices=dist.get_world_size(),
        strategy=PolicyDDPStrategy(process_group_backend="gloo"),
        use_distributed_sampler=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    model = _Evaluated(signal_at)
    error = ""
    try:
        getattr(trainer, stage)(model)
    except Exception as raised:
        error = f"{type(raised).__name__}: {str(raised).splitlines()[0]}"
    return {"error": error, "completed": model.completed, "signal_time": model.signal_time, "end": time.monotonic()}
