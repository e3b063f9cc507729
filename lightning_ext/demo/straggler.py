"""The demo's straggler: one rank's data loading made slow on purpose, found from per-rank telemetry."""

import os
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader, Dataset

from lightning_ext.rank_metrics import PerRankMetrics, read_rank_metrics
from lightning_ext.rank_spread import find_stragglers
from lightning_ext.strategies import PolicyDDPStrategy

__all__ = ["DELAY", "find_the_straggler"]

DELAY = 0.03  # seconds per batch that the slow rank's loader sleeps
_BATCHES = 12


class _Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random regression samples; ``delay`` seconds per batch of loading on the rank that is slow on purpose."""

    def __init__(self, size: int, delay: float) -> None:
        self.size, self.delay = size, delay

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(8, generator=generator), torch.randn(1, generator=generator)


class _Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def find_the_straggler(devices: int, root: str, *, tensorboard: bool = False) -> list[str] | None:
    """Fit with telemetry, the last rank slow in data loading; on rank 0, the lines that say what was found.

    With ``tensorboard``, the run logs with a ``TensorBoardLogger``: every rank's curves in ``<root>/straggler``, one
    TensorBoard run per rank (``scripts/tensorboard_screenshot.py`` takes the docs' picture of it).
    """
    slow = devices - 1
    logger = (TensorBoardLogger if tensorboard else CSVLogger)(root, name="", version="straggler")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=PolicyDDPStrategy(per_rank_metrics=PerRankMetrics(telemetry=True, telemetry_every_n_steps=1)),
        max_epochs=1,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = _Samples(4 * _BATCHES * devices, DELAY / 4 if trainer.global_rank == slow else 0.0)  # 4 per batch
    trainer.fit(_Regression(), DataLoader(data, batch_size=4))
    trainer.strategy.barrier()  # every rank has closed its per-rank file before rank 0 reads them
    if not trainer.is_global_zero:
        return None
    log_dir = os.path.join(root, "straggler")
    table = read_rank_metrics(log_dir)
    found = find_stragglers(table)
    lines = [f"\na straggler: rank {slow}'s data loading made slow on purpose ({DELAY * 1000:.0f} ms per batch)."]
    lines.append(
        "Each rank timed its own batches and its waits for the others (no collective added); the verdict, read back"
        f" from {log_dir}:"
    )
    for record in found.itertuples():
        lines.append(
            f"  rank {record.rank} held the others back in {record.held} of {record.rows} telemetry rows"
            f" ({record.pattern}): {record.phase} took it {record.excess_s * 1000:.1f} ms more per batch than them"
            f" ({record.seconds * 1000:.1f} ms against {record.others_s * 1000:.2f} ms), and they lost"
            f" {record.cost:.0%} of their step time waiting for it"
        )
    named = sorted({(int(rank), str(phase)) for rank, phase in zip(found["rank"], found["phase"], strict=True)})
    if named == [(slow, "data loading")]:
        lines.append(f"  checked: the verdict names rank {slow} and its data loading, the rank and phase slowed, alone")
    elif found.empty:
        lines.append(f"  checked: no straggler found, not rank {slow}: the machine may be too busy to tell")
    else:
        lines.append(
            f"  checked: the verdict does not name rank {slow}'s data loading alone (it names"
            f" {', '.join(f'rank {rank} ({phase})' for rank, phase in named)}): the machine may be too busy to tell"
        )
    lines.append(f"  the same from the command line: lightning-ext ranks {log_dir} --stragglers")
    return lines
