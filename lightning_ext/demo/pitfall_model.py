"""The demo's pitfall model, a user's training script: the demo runs a copy of this file (``docs/internals.md``)."""

import argparse
import json
import os
import time
from typing import Any

from lightning_ext.demo.pitfalls import PITFALLS


def _train(pitfall: str, devices: int, out_dir: str) -> None:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_ext import CrossRankError, PolicyDDPStrategy

    class Pitfall(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.layer(batch[0]).pow(2).mean()
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", self.layer(batch[0]).pow(2).mean(), sync_dist=True)

        def on_validation_epoch_end(self) -> None:
            if pitfall == "log_on_rank_zero" and self.trainer.is_global_zero:
                self.log("val_acc", torch.tensor(1.0), sync_dist=True)

        def train_dataloader(self) -> "DataLoader[Any]":
            extra = 2 if pitfall == "uneven_batches" and self.trainer.global_rank == 1 else 0
            return DataLoader(TensorDataset(torch.randn(8 * (4 + extra), 4)), batch_size=8)

        def val_dataloader(self) -> "DataLoader[Any]":
            return DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=8)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=PolicyDDPStrategy(),
        max_epochs=2,
        use_distributed_sampler=False,  # each rank reads its own data, as with per-rank shards
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    outcome: dict[str, Any] = {"error": None, "message": None}
    try:
        trainer.fit(Pitfall())
    except CrossRankError as error:
        outcome = {"error": type(error).__name__, "message": str(error)}
    outcome.update(rank=trainer.global_rank, at=time.time())
    with open(os.path.join(out_dir, f"rank_{trainer.global_rank}.json"), "w", encoding="utf-8") as file:
        json.dump(outcome, file)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("pitfall", choices=sorted(PITFALLS))
    parser.add_argument("out_dir")
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args(argv)
    _train(args.pitfall, args.devices, args.out_dir)


if __name__ == "__main__":
    main()
