"""Fits that watch ``torch.distributed`` from the side (rank pools): whether its functions stay the originals, and
whether a barrier that another thread calls during the coalesced syncs runs.

Each fit logs ``VALUES`` synced values a step in ``training_step`` (more than a check carries, so every step's pack
goes through Lightning's ``strategy.reduce``, where Lightning runs a barrier before its all-reduce) and ``EPOCH``
values per epoch (an epoch round's packs take the same path).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ddp as lightning_ddp
from torch.utils.data import DataLoader, TensorDataset

VALUES = 130  # 520 bytes of float32: more than the 512 bytes a check carries
EPOCH = 3


class ManyValues(L.LightningModule):
    """Logs ``VALUES`` synced step values and ``EPOCH`` synced epoch values per training step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        values = loss.detach() + torch.arange(VALUES, dtype=torch.float32) + self.global_rank
        self.log_dict({f"v{index}": value for index, value in enumerate(values)}, sync_dist=True)
        for index in range(EPOCH):
            self.log(f"e{index}", loss.detach() * index, sync_dist=True, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(options: dict[str, Any], callbacks: list[L.Callback], steps: int, epochs: int = 1) -> None:
    from lightning_ext import PolicyDDPStrategy

    world = dist.get_world_size()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=PolicyDDPStrategy(**options),
        max_epochs=epochs,
        limit_train_batches=steps,
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(ManyValues(), DataLoader(TensorDataset(torch.randn(steps, 2)), batch_size=1))


def _functions() -> dict[str, Any]:
    """Every public function of ``torch.distributed``, by name."""
    names = [name for name in dir(dist) if not name.startswith("_")]
    return {name: getattr(dist, name) for name in names if callable(getattr(dist, name))}


def _replaced(originals: dict[str, Any]) -> list[str]:
    return sorted(name for name, function in originals.items() if getattr(dist, name, None) is not function)


class _AtSetUp(L.Callback):
    """Notes the replaced functions once the strategy has set up (its process group, checks and threads)."""

    def __init__(self, originals: dict[str, Any]) -> None:
        self.originals = originals
        self.replaced: list[str] | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.replaced = _replaced(self.originals)


def functions_replaced(options: dict[str, Any]) -> dict[str, Any]:
    """Which ``torch.distributed`` functions a fit replaced: after set-up, inside each of Lightning's syncs (where its
    barrier and all-reduce run), at any time as seen by a thread that polls every half millisecond, after teardown."""
    originals = _functions()
    seen_in_syncs: set[str] = set()
    syncs = 0
    sync = lightning_ddp._sync_ddp_if_available

    def watched_sync(*args: Any, **kwargs: Any) -> Any:
        nonlocal syncs
        syncs += 1
        seen_in_syncs.update(_replaced(originals))
        return sync(*args, **kwargs)

    polled: set[str] = set()
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            polled.update(_replaced(originals))
            time.sleep(0.0005)

    poller = threading.Thread(target=poll, daemon=True)
    at_set_up = _AtSetUp(originals)
    lightning_ddp._sync_ddp_if_available = watched_sync
    poller.start()
    try:
        _fit(options, [at_set_up], steps=12, epochs=2)
    finally:
        done.set()
        poller.join()
        lightning_ddp._sync_ddp_if_available = sync
    return {
        "set_up": at_set_up.replaced,
        "in_syncs": sorted(seen_in_syncs),
        "syncs": syncs,
        "polled": sorted(polled),
        "after": _replaced(originals),
    }


class _BarrierThread(L.Callback):
    """From the first training batch on, a thread calls ``dist.barrier`` on a gloo group of its own ``count`` times."""

    def __init__(self, count: int) -> None:
        self.count, self.completed, self.error = count, 0, ""
        self.group = dist.new_group(backend="gloo")  # every rank of the pool creates it, before the fit
        self.thread = threading.Thread(target=self._barriers, daemon=True)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self.thread.start()

    def _barriers(self) -> None:
        try:
            for _ in range(self.count):
                dist.barrier(group=self.group)
                self.completed += 1
        except Exception as error:  # a barrier skipped on one rank: the other's next one fails or never completes
            self.error = f"{type(error).__name__}: {error}"


def barriers_beside_training(options: dict[str, Any], count: int, steps: int) -> dict[str, Any]:
    """How many of its ``count`` barriers a thread completed while (and after) the training thread synced values."""
    barriers = _BarrierThread(count)
    _fit(options, [barriers], steps=steps)
    barriers.thread.join(timeout=60)  # every rank's thread makes the same calls: they complete, unless one was skipped
    if not barriers.thread.is_alive():
        dist.destroy_process_group(barriers.group)
    return {"completed": barriers.completed, "error": barriers.error, "alive": barriers.thread.is_alive()}
