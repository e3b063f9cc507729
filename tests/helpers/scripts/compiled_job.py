"""A user's script: a ``torch.compile``'d LightningModule that logs synced values in ``training_step``, on 2 CPU ranks.

Usage: ``python compiled_job.py STRATEGY OUT`` with STRATEGY ``ours`` (``PolicyDDPStrategy()``), ``stock``
(``"ddp"``) or ``eager`` (``"ddp"``, the module not compiled: the reference). Rank 0 writes ``OUT/outcome.json``:
``{"error": class name or null, "message": ..., "losses": the synced loss of every step}``. The module is compiled
with dynamo's ``eager`` backend: dynamo traces ``training_step`` exactly as with the default backend (where stock
fails), without the C++ compile that the default backend's first step takes.
"""

import json
import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.losses: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, sync_dist=True)
        self.log("loss_max", loss, sync_dist=True, reduce_fx="max")
        return loss

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        self.losses.append(float(self.trainer.callback_metrics["loss"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    kind, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    module = Regression()
    model = module if kind == "eager" else torch.compile(module, backend="eager")
    if kind == "ours":
        from lightning_ext import PolicyDDPStrategy

        strategy: object = PolicyDDPStrategy()
    else:
        strategy = "ddp"
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    outcome: dict[str, object] = {"error": None, "message": None}
    try:
        trainer.fit(model, DataLoader(data, batch_size=4))
    except Exception as error:
        outcome = {"error": type(error).__name__, "message": str(error).splitlines()[0]}
        print(f"rank {trainer.global_rank}: {outcome['error']}: {outcome['message']}", file=sys.stderr, flush=True)
    if trainer.global_rank == 0:
        outcome["losses"] = module.losses
        with open(os.path.join(out, "outcome.json"), "w") as handle:
            json.dump(outcome, handle)


if __name__ == "__main__":
    main()
