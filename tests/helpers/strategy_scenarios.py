"""One scripted ``Trainer.fit`` scenario for every strategy and launcher: rank pools, torchrun, SLURM, notebooks.

Each rank logs ``val_loss = TABLE[global rank][epoch]`` un-synced, so the ranks disagree and the policies matter. The
same function runs in a :class:`tests.helpers.pool.RankPool` rank, under ``torchrun`` or a simulated ``srun`` (through
``tests/helpers/scripts/strategy_run.py``), or forked by Lightning from a stand-in notebook kernel. Every rank writes
what it ended with to ``<root>/outcomes/rank_<r>.json`` (from a callback, since under fork and spawn only rank 0
returns) and returns it.

The expected outcomes below are worked out by hand from the policy rules (README), independently of lightning-ext.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch.utils.data import DataLoader, TensorDataset

from lightning_ext import PolicyDDPStrategy, PolicyModelParallelStrategy, PolicyStrategyMixin

# ---- the scripted metric, un-synced: rank r logs TABLE[r][epoch] --------------------------------------------------
# epoch:      0     1     2     3     4     5
TABLE = [
    [5.0, 4.0, 4.50, 3.00, 3.50, 3.75],  # rank 0
    [5.0, 6.5, 3.00, 3.50, 2.00, 2.50],  # rank 1
    [5.0, 4.5, 4.00, 4.25, 3.00, 3.25],  # rank 2
    [5.0, 5.5, 5.25, 2.50, 2.75, 2.00],  # rank 3
]
MAX_EPOCHS = 8  # the table has 6 epochs: every expected stop below is an early stop
CHECKPOINT = {"monitor": "val_loss", "filename": "{epoch}-{val_loss:.2f}", "save_top_k": 1, "save_last": True}
PATIENCE = 1  # a rank votes to stop at its first epoch without a new best of its own

# ---- hand-worked outcomes ------------------------------------------------------------------------------------------
# EarlyStopping(patience=1) votes (stop = no new own best): rank 0: e2, e4, e5; rank 1: e1, e3, e5; rank 2: e3, e5;
# rank 3: e1, e2, e4. Stock "any" stops at e1 whatever the world size.
# 2 ranks (rows 0-1): votes e1 (F,T) e2 (T,F) e3 (F,T) e4 (T,F) e5 (T,T); "majority" (more than half: 2 of 2) stops e5.
#   checkpoint "mean": 5.0, 5.25 (no), 3.75, 3.25, 2.75, 3.125 (no): saves e0, e2, e3, e4, named by the mean.
#   checkpoint "majority": each rank compares with its own value at the last agreed save. e0 save (bests 5, 5);
#   e1 (4<5, 6.5<5) = (T,F) no; e2 (4.5<5, 3<5) save, named by rank 0's 4.50 (bests 4.5, 3); e3 (3<4.5, 3.5<3) no;
#   e4 (3.5<4.5, 2<3) save, named 3.50 (bests 3.5, 2); e5 (3.75<3.5, 2.5<2) no.
# 4 ranks: votes e1 (F,T,F,T) e2 (T,F,F,T) e3 (F,T,T,F) e4 (T,F,F,T): 2 of 4 each, no; e5 (T,T,T,F): 3 of 4, stop.
#   checkpoint "mean": 5.0, 5.125 (no), 4.1875, 3.3125, 2.8125, 2.875 (no): saves e0, e2, e3, e4.
EXPECTED: dict[tuple[int, str, str], dict[str, Any]] = {
    (2, "mean", "majority"): {
        "saves": [
            "epoch=0-val_loss=5.00.ckpt",
            "epoch=2-val_loss=3.75.ckpt",
            "epoch=3-val_loss=3.25.ckpt",
            "epoch=4-val_loss=2.75.ckpt",
        ],
        "stopped_epoch": 5,
    },
    (2, "majority", "majority"): {
        "saves": ["epoch=0-val_loss=5.00.ckpt", "epoch=2-val_loss=4.50.ckpt", "epoch=4-val_loss=3.50.ckpt"],
        "stopped_epoch": 5,
    },
    (4, "mean", "majority"): {
        "saves": [
            "epoch=0-val_loss=5.00.ckpt",
            "epoch=2-val_loss=4.19.ckpt",
            "epoch=3-val_loss=3.31.ckpt",
            "epoch=4-val_loss=2.81.ckpt",
        ],
        "stopped_epoch": 5,
    },
}
EPOCHS_RUN = 6  # epochs 0-5: the stop at e5 ends the run
PATH_KEYS = ("best_model_path", "last_model_path", "kth_best_model_path", "best_k_models", "log_dir")


class ShardableTableModule(L.LightningModule):
    """Logs the table's value for its rank; shards its layer with FSDP2 under ``ModelParallelStrategy``."""

    def __init__(self, table: list[list[float]]) -> None:
        super().__init__()
        self.table = table
        self.layer = torch.nn.Linear(4, 4)

    def configure_model(self) -> None:
        if isinstance(self.trainer.strategy, ModelParallelStrategy):
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("step_tag", float(100 * self.global_rank + self.global_step))  # a per-step row, scripted
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        row = self.table[self.global_rank]
        self.log("val_loss", torch.tensor(row[min(self.current_epoch, len(row) - 1)]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class RecordingCheckpoint(ModelCheckpoint):
    """Stock, except that it records every checkpoint it saves (on every rank)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.saves: list[str] = []

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        self.saves.append(os.path.basename(filepath))
        super()._save_checkpoint(trainer, filepath)


class Reporter(L.Callback):
    """Writes this rank's outcome at the end of fit, from inside the rank."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.outcome: dict[str, Any] = {}

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        checkpoint = trainer.checkpoint_callback
        stopping = trainer.early_stopping_callback
        assert isinstance(checkpoint, RecordingCheckpoint) and stopping is not None
        self.outcome = {
            "rank": trainer.global_rank,
            "node_rank": trainer.node_rank,
            "local_rank": trainer.local_rank,
            "world_size": trainer.world_size,
            "pid": os.getpid(),
            "strategy": type(trainer.strategy).__name__,
            "saves": list(checkpoint.saves),
            "best_model_path": checkpoint.best_model_path,
            "last_model_path": checkpoint.last_model_path,
            "kth_best_model_path": checkpoint.kth_best_model_path,
            "best_k_models": sorted(checkpoint.best_k_models),
            "stopped_epoch": stopping.stopped_epoch,
            "should_stop": trainer.should_stop,
            "current_epoch": trainer.current_epoch,
            "log_dir": trainer.log_dir,
        }
        out = Path(self.root, "outcomes", f"rank_{trainer.global_rank}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.outcome))


class TunedDDPStrategy(DDPStrategy):
    """A user's own strategy: DDP with a default of their choosing (docs/strategies.md, "Your own strategy")."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("gradient_as_bucket_view", True)
        super().__init__(*args, **kwargs)


class PolicyTunedDDPStrategy(PolicyStrategyMixin, TunedDDPStrategy):
    """The mixin applied to it, as the documentation shows."""


STRATEGIES: dict[str, type] = {
    "ddp": PolicyDDPStrategy,
    "model_parallel": PolicyModelParallelStrategy,
    "tuned_ddp": PolicyTunedDDPStrategy,
    "stock_model_parallel": ModelParallelStrategy,
}


def make_strategy(spec: str | dict[str, Any]) -> Any:
    """A registry name as is; ``{"class": <a key of STRATEGIES>, **arguments}`` builds that class."""
    if isinstance(spec, str):
        return spec
    arguments = dict(spec)
    return STRATEGIES[arguments.pop("class")](**arguments)


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(8, 4, generator=generator)), batch_size=4)


def fit(root: str, strategy: str | dict[str, Any], devices: int, num_nodes: int = 1) -> dict[str, Any]:
    """One ``Trainer.fit`` of the scenario on this rank; returns (and writes) the rank's outcome."""
    reporter = Reporter(root)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy=make_strategy(strategy),
        max_epochs=MAX_EPOCHS,
        callbacks=[RecordingCheckpoint(**CHECKPOINT), EarlyStopping(monitor="val_loss", patience=PATIENCE), reporter],
        logger=CSVLogger(root),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        deterministic=True,
    )
    trainer.fit(ShardableTableModule(TABLE), _loader(), _loader())
    return reporter.outcome


def checkpoint_listing(directory: str) -> dict[str, list[str] | None]:
    """Each entry of a checkpoint directory: ``None`` for a file, the sorted file names inside for a directory."""
    return {
        entry.name: sorted(p.name for p in entry.iterdir()) if entry.is_dir() else None
        for entry in sorted(Path(directory).iterdir())
    }
