"""Correct programs in which one rank is slower than the others in one phase, run in the rank pools or launched.

A *plan* says which rank is slow, where, how (``"compute"``: real matrix products for that long, inside the phase's
own code; ``"sleep"``), and for how long. Every phase is a place where the other ranks go on to a hang check and
wait there: the forward pass, a backward pass with and without gradient sync, ``torch.autograd.grad`` (a gradient
penalty), data loading, a callback, writing a checkpoint, the first batch, a validation step. The program is correct
whatever the timing, so it must end exactly as the same program does under stock ``DDPStrategy`` without delays.
With ``"buffers": True`` the model has a BatchNorm layer: DDP broadcasts its buffers at each forward pass.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch.utils.data import DataLoader, Dataset

PHASES = (
    "forward",
    "first_batch",
    "backward_synced",
    "backward_accumulating",
    "grad_penalty",
    "data",
    "val_data",
    "callback",
    "checkpoint",
    "validation",
)
BATCHES = 4


def stall(how: str, seconds: float, parameter: torch.Tensor | None = None) -> None:
    """Be busy for ``seconds``: real computation (matrix products, or elementwise work on a sharded ``DTensor``
    parameter, which runs inside ``torch.distributed``'s dispatch code) or a sleep."""
    end = time.monotonic() + seconds
    if how == "sleep":
        time.sleep(seconds)
    elif how == "dtensor" and parameter is not None:
        with torch.no_grad():
            while time.monotonic() < end:
                parameter.detach().mul(1.0001).add(0.5).to_local().sum()  # DTensor ops, no collective
    else:
        a = torch.rand(256, 256)
        while time.monotonic() < end:
            a = torch.tanh(a @ a)


class _Plan:
    def __init__(self, plan: dict[str, Any] | None, rank: int, parameter: torch.Tensor | None = None) -> None:
        self.delays = [d for d in (plan or {}).get("delays", []) if d["rank"] == rank]
        self.parameter = parameter

    def at(self, phase: str, epoch: int, batch: int | None) -> None:
        """Stall if the plan says so for this rank at ``phase`` of ``epoch`` (``batch``: ``None``, once per epoch)."""
        for delay in self.delays:
            if delay["phase"] == phase and delay["epoch"] == epoch and batch in (delay["batch"], None):
                stall(delay["how"], delay["seconds"], self.parameter)


class _SlowBackward(torch.autograd.Function):
    """Identity whose backward can be made slow: it runs inside the autograd engine (C++), like a real slow layer."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, hold: Any) -> torch.Tensor:
        ctx.hold = hold
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.hold()
        return grad, None


class _Data(Dataset):
    def __init__(self, plan: _Plan, module: SlowRankModule, phase: str = "data") -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(BATCHES * 2, 4, generator=generator)
        self.y = torch.randn(BATCHES * 2, 1, generator=generator)
        self.plan, self.module, self.phase = plan, module, phase

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index % 2 == 0:  # once per batch of two
            self.plan.at(self.phase, self.module.current_epoch, index // 2)
        return self.x[index], self.y[index]


class SlowRankModule(L.LightningModule):
    """Logs synced values in the training step, at batch end and in validation; the plan slows one rank somewhere."""

    def __init__(self, plan: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.plan_spec = plan
        torch.manual_seed(0)
        buffers = [torch.nn.BatchNorm1d(8)] if (plan or {}).get("buffers") else []
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), *buffers, torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self._in_penalty = False

    @property
    def plan(self) -> _Plan:
        return _Plan(self.plan_spec, self.global_rank, self.net[0].weight)

    def configure_model(self) -> None:
        if isinstance(self.trainer.strategy, ModelParallelStrategy):
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

    def _hold_backward(self, batch_idx: int) -> Any:
        def hold() -> None:
            if self._in_penalty:
                self.plan.at("grad_penalty", self.current_epoch, batch_idx)
                return
            accumulating = (batch_idx + 1) % self.trainer.accumulate_grad_batches != 0
            phase = "backward_accumulating" if accumulating else "backward_synced"
            self.plan.at(phase, self.current_epoch, batch_idx)

        return hold

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.plan.at("forward", self.current_epoch, batch_idx)
        if self.current_epoch == 0 and batch_idx == 0:
            self.plan.at("first_batch", 0, 0)
        x = x.clone().requires_grad_(True)
        h = _SlowBackward.apply(x, self._hold_backward(batch_idx))  # input side: its backward runs last
        out = self.net(h)
        loss = torch.nn.functional.mse_loss(out, y)
        if (self.plan_spec or {}).get("penalty", True):
            self._in_penalty = True
            (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)
            self._in_penalty = False
            loss = loss + 0.01 * grad.pow(2).mean()
        self.log("loss", loss, sync_dist=True)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.log("loss_end", outputs["loss"].detach() * 2, sync_dist=True)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.plan.at("validation", self.current_epoch, batch_idx)
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.plan.at("checkpoint", self.current_epoch, None)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Data(self.plan, self), batch_size=2)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_Data(self.plan, self, "val_data"), batch_size=2)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _SlowCallback(Callback):
    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        module.plan.at("callback", trainer.current_epoch, batch_idx)


def fit(
    log_dir: str,
    plan: dict[str, Any] | None,
    options: dict[str, Any],
    world_size: int,
    waits: tuple[float, float] | None = None,
    num_nodes: int = 1,
) -> dict[str, Any]:
    """One fit on this rank (in a rank pool, or a launched job with ``world_size`` devices per node).

    ``options`` are the strategy's, plus ``"strategy"``: ``"ddp"`` (default), ``"model_parallel"``, ``"stock"`` or
    ``"stock_model_parallel"``. ``waits`` (first look, between looks) replaces the hang checks' thresholds.
    """
    from lightning_ext import PolicyDDPStrategy, PolicyModelParallelStrategy
    from lightning_ext._checks import lockstep

    looks: list[str] = []
    diagnose = lockstep.Lockstep._diagnose

    def counted(self: Any, point: Any, *rest: Any) -> None:
        looks.append(point.where)
        time.sleep((plan or {}).get("slow_looks", 0.0))  # a look that takes long: the check may complete meanwhile
        diagnose(self, point, *rest)

    saved = lockstep._FIRST_WAIT, lockstep._NEXT_WAIT, lockstep.Lockstep._diagnose
    if waits is not None:
        lockstep._FIRST_WAIT, lockstep._NEXT_WAIT = waits
    lockstep.Lockstep._diagnose = counted  # type: ignore[method-assign]
    options = dict(options)
    kind = options.pop("strategy", "ddp")
    strategies: dict[str, Any] = {
        "ddp": lambda: PolicyDDPStrategy(**options),
        "model_parallel": lambda: PolicyModelParallelStrategy(**options),
        "stock": lambda: DDPStrategy(start_method="popen"),
        "stock_model_parallel": lambda: ModelParallelStrategy(),
    }
    try:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=world_size,
            num_nodes=num_nodes,
            strategy=strategies[kind](),
            max_epochs=2,
            accumulate_grad_batches=(plan or {}).get("accumulate", 1),
            logger=False,
            default_root_dir=log_dir,  # where a stall report would go
            callbacks=[_SlowCallback(), ModelCheckpoint(dirpath=log_dir, save_top_k=-1, every_n_epochs=1)],
            enable_progress_bar=False,
            enable_model_summary=False,
            use_distributed_sampler=False,
            num_sanity_val_steps=0,
        )
        outcome: dict[str, Any] = {"error": None, "message": None}
        try:
            trainer.fit(SlowRankModule(plan))
        except Exception as error:
            outcome = {"error": type(error).__name__, "message": str(error)}
    finally:
        lockstep._FIRST_WAIT, lockstep._NEXT_WAIT, lockstep.Lockstep._diagnose = saved
    module = trainer.lightning_module
    tensors = [p.detach() for p in module.parameters()]
    tensors = [t.full_tensor() if hasattr(t, "full_tensor") else t for t in tensors]  # FSDP2 shards: every rank's
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in tensors)).hexdigest()
    return {
        **outcome,
        "looks": looks,
        "global_step": trainer.global_step,
        "weights": digest,
        "metrics": {key: float(value) for key, value in sorted(trainer.callback_metrics.items())},
        "stall_report": _read(Path(log_dir, "stall_report.txt")),
    }


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None
