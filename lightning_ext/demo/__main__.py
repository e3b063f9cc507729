"""``python -m lightning_ext.demo``: a tiny DDP run under each policy, a straggler found, then two pitfalls."""

import argparse
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_ext.demo.pitfalls import PITFALLS, run_pitfall
from lightning_ext.demo.straggler import find_the_straggler
from lightning_ext.policies import Quorum
from lightning_ext.rank_metrics import read_rank_metrics
from lightning_ext.rank_spread import format_spread, summarize_spread
from lightning_ext.strategies import PolicyDDPStrategy

__all__ = ["main"]

_STOCK = object()
_RECORDED = "majority"  # the run whose decision record the demo shows
_POLICIES: list[tuple[str, Any]] = [  # (column, policy for both decisions); "defaults" is all/any, stock's rules
    ("stock ddp", _STOCK),
    ("defaults", None),
    ("all", "all"),
    ("any", "any"),
    ("majority", "majority"),
    ("rank_zero", "rank_zero"),
    ("quorum(2)", Quorum(2)),
    ("mean", "mean"),
    ("min", "min"),
    ("max", "max"),
]


class _ShardedRegression(L.LightningModule):
    """Linear regression; each rank validates on a small, noisy shard of its own (a new draw every epoch)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.epochs_run = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))  # un-synced: each rank's own view

    def on_validation_epoch_end(self) -> None:
        self.epochs_run += 1

    def val_dataloader(self) -> "DataLoader[Any]":
        rank, epoch = self.trainer.global_rank, self.current_epoch
        generator = torch.Generator().manual_seed(1000 * rank + epoch)
        x = torch.randn(12, 8, generator=generator)
        noise = (0.5 + 0.5 * rank) * torch.randn(12, 1, generator=generator)
        return DataLoader(TensorDataset(x, x @ _TRUE_WEIGHTS + noise), batch_size=12)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


_TRUE_WEIGHTS = torch.linspace(-1, 1, 8).unsqueeze(1)


class ModelCheckpointThatCounts(ModelCheckpoint):
    """Remembers at which epochs a new top-k checkpoint was saved."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.saved_epochs: list[int] = []

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        self.saved_epochs.append(trainer.current_epoch)
        super()._save_checkpoint(trainer, filepath)


def _train_loader() -> "DataLoader[Any]":
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    y = x @ _TRUE_WEIGHTS + 0.3 * torch.randn(64, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=16)


def _run(policy: Any, devices: int, epochs: int, root: str, logger: bool = False) -> dict[str, Any]:
    if policy is _STOCK:
        strategy: Any = "ddp"
    elif policy is None:
        strategy = PolicyDDPStrategy(per_rank_metrics=True)
    else:
        strategy = PolicyDDPStrategy(checkpoint_policy=policy, early_stopping_policy=policy, per_rank_metrics=True)
    checkpoint = ModelCheckpointThatCounts(
        dirpath=os.path.join(root, "checkpoints"), monitor="val_loss", filename="{epoch}-{val_loss:.3f}"
    )
    stopping = EarlyStopping(monitor="val_loss", patience=3)
    L.seed_everything(0, verbose=False)  # every run trains identically: only the decisions differ
    model = _ShardedRegression()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_epochs=epochs,
        callbacks=[checkpoint, stopping],
        logger=CSVLogger(root, name="", version="") if logger else False,  # with a logger: the decision record
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        reload_dataloaders_every_n_epochs=1,
        default_root_dir=root,
    )
    trainer.fit(model, train_dataloaders=_train_loader())
    trainer.strategy.barrier()  # every rank has closed its per-rank file before rank 0 reads them
    ended = {
        "saved at epochs": checkpoint.saved_epochs,
        "stop epoch": stopping.stopped_epoch if trainer.should_stop else None,
        "best checkpoint": checkpoint.best_model_path,
        "epochs run": model.epochs_run,
    }
    everyone: list[Any] = [ended]
    if torch.distributed.is_initialized():  # what each rank ended with, to compare them
        everyone = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, ended)
    values: list[list[float]] | None = None
    if policy is not _STOCK and trainer.is_global_zero:
        table = read_rank_metrics(root).dropna(subset=["val_loss"])
        values = [table[table["rank"] == rank]["val_loss"].tolist() for rank in range(devices)]
    return {
        "values": values,
        "root": root,
        "saved": checkpoint.saved_epochs,
        "stopped": stopping.stopped_epoch if trainer.should_stop else None,
        "epochs_run": model.epochs_run,
        "best": os.path.basename(checkpoint.best_model_path),
        "rank": trainer.global_rank,
        "differs": [text for what in ended if (text := _differs(what, [theirs[what] for theirs in everyone]))],
    }


def _differs(what: str, values: list[Any]) -> str:
    """``what`` and each rank's value (file names only) where the ranks ended differently, else ``""``."""
    if all(value == values[0] for value in values):
        return ""
    shown = [os.path.basename(value) if isinstance(value, str) else value for value in values]
    return f"{what} ({', '.join(f'rank {rank}: {value}' for rank, value in enumerate(shown))})"


def _table(runs: dict[str, dict[str, Any]], devices: int, epochs: int) -> str:
    names = list(runs)
    # training does not depend on the policy (only when it stops), so any run that reached an epoch has its values
    values = [[float("nan")] * epochs for _ in range(devices)]
    for run in runs.values():
        for rank, own in enumerate(run["values"] or []):  # each rank's own values, from its per-rank file
            for epoch, value in enumerate(own):
                values[rank][epoch] = value
    width = max(9, *(len(name) for name in names))
    header = ["epoch", *(f"rank {r}" for r in range(devices)), *names]
    widths = [5] + [7] * devices + [width] * len(names)
    lines = [" ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    for epoch in range(epochs):
        if all(epoch >= run["epochs_run"] for run in runs.values()):
            break
        cells = [str(epoch)]
        cells += [f"{values[r][epoch]:.3f}" if values[r][epoch] == values[r][epoch] else "-" for r in range(devices)]
        for name in names:
            run = runs[name]
            if epoch >= run["epochs_run"]:
                cells.append("")
                continue
            mark = "*" if epoch in run["saved"] else "."
            cells.append(mark + (" stop" if run["stopped"] == epoch else ""))
        lines.append(" ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    lines.append("")
    lines.append("best checkpoint per run:")
    for name in names:
        lines.append(f"  {name:>{width}}: {runs[name]['best']}")
    return "\n".join(lines)


def _agreement(runs: dict[str, dict[str, Any]]) -> str:
    """What the ranks ended with, compared across ranks: which runs agree, and what differs in the others."""
    differs = {name: run["differs"] for name, run in runs.items()}
    same = [name for name, parts in differs.items() if not parts]
    lines = ["", "checked across ranks (saved epochs, stop epoch, best checkpoint path, epochs run):"]
    if same:
        lines.append(f"  every rank ended the same in: {', '.join(same)}")
    lines += [f"  {name}: the ranks differ in {'; '.join(parts)}" for name, parts in differs.items() if parts]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        "python -m lightning_ext.demo",
        description="Train a tiny model with DDP on CPU processes under each policy, and print what each decided.",
    )
    parser.add_argument("--devices", type=int, default=3, help="CPU processes (ranks); default 3")
    parser.add_argument("--epochs", type=int, default=10, help="maximum epochs per run; default 10")
    parser.add_argument("--root", default="demo_logs", help="where checkpoints go; default ./demo_logs")
    parser.add_argument("--no-pitfalls", action="store_true", help="leave out the two pitfalls that freeze stock DDP")
    args = parser.parse_args(argv)

    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*sync_dist=True.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    runs = {}
    for name, policy in _POLICIES:
        root = os.path.join(args.root, name.replace(" ", "_").replace("(", "").replace(")", ""))
        if os.environ.get("LOCAL_RANK", "0") == "0" and os.path.isdir(root):
            shutil.rmtree(root)
        runs[name] = _run(policy, args.devices, args.epochs, root, logger=name == _RECORDED)
    straggler = find_the_straggler(args.devices, args.root) if args.devices > 1 else None
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # a clean exit for every rank
    if runs["stock ddp"]["rank"] == 0:
        print(f"\nval_loss per rank (un-synced), and each run's decisions ({args.devices} CPU ranks, gloo):")
        print("  * = saved a new best checkpoint (save_top_k=1)   stop = EarlyStopping(patience=3) stopped all ranks")
        print("  'defaults' is PolicyDDPStrategy() (checkpoint 'all', early stopping 'any'); every other column uses")
        print("  its policy for both decisions.\n")
        print(_table(runs, args.devices, args.epochs))
        print(_agreement(runs))
        defaults = runs["defaults"]["root"]
        print(f"\nspread across ranks of the 'defaults' run (lightning-ext ranks {defaults}):")
        print(format_spread(summarize_spread(read_rank_metrics(defaults), metrics=["val_loss"])))
        print("\n".join(straggler or []))
        _show_record(runs[_RECORDED]["root"])
        if not args.no_pitfalls:
            _show_pitfalls(args.devices, os.path.join(args.root, "pitfalls"))


def _show_record(root: str) -> None:
    """Why the checkpoints of the 'majority' run were (not) saved, as `lightning-ext decisions` tells it."""
    command = ["lightning-ext", "decisions", root, "--callback", "ModelCheckpointThatCounts"]
    print(f"\nwhy the '{_RECORDED}' run saved a checkpoint, or not ({' '.join(command)}):")
    run = subprocess.run([sys.executable, "-m", "lightning_ext", *command[1:]], capture_output=True, text=True)
    print(textwrap.indent(run.stdout.rstrip() or run.stderr.rstrip(), "  "))


def _show_pitfalls(devices: int, root: str) -> None:
    print("\ntwo pitfalls that freeze stock DDP until its 30-minute timeout, under PolicyDDPStrategy() (checks on):")
    for pitfall, what in PITFALLS.items():
        outcomes = run_pitfall(pitfall, devices, os.path.join(root, pitfall))
        first = min(outcome["at"] for outcome in outcomes)
        print(f"\n  {pitfall}: {what}")
        for outcome in outcomes:
            after = outcome["at"] - first
            print(f"    rank {outcome['rank']}: {outcome['error']}, raised {after:.1f} s after the first rank")
        same = len({outcome["message"] for outcome in outcomes}) == 1
        print("    the message" + (", the same on every rank:" if same else " on rank 0:"))
        print(textwrap.indent(str(outcomes[0]["message"]), "    | "))


if __name__ == "__main__":
    main()
