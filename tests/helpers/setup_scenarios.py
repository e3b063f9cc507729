"""Real ``Trainer`` runs for the rank pools, with dataloaders set up right or wrong (generators, default devices).

Each rank builds its own loaders from plain arguments, so one rank can get a mistake the others do not. Each returns
what it saw: how often its loader hooks ran, how many loader checks lightning-ext made, and its warnings.
"""

from __future__ import annotations

import contextlib
import unittest.mock
import warnings
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler, TensorDataset

from lightning_ext import PolicyDDPStrategy
from lightning_ext._setup.checks import SetupChecks
from lightning_ext.errors import InitModuleWarning


class ReportsCuda(torch.Generator):
    """A CPU generator that says it is on CUDA: what the checks read, on a machine without a GPU."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


class OwnSampler(Sampler[int]):
    """A user's own sampler holding a generator that reports CUDA, and drawing correctly on the CPU: not judged."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.generator = ReportsCuda()

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.size, generator=torch.Generator().manual_seed(0)).tolist())

    def __len__(self) -> int:
        return self.size


class LoaderModule(L.LightningModule):
    """A tiny model whose loaders are built from ``loader`` (see :func:`make_loader`); counts the hooks' calls."""

    def __init__(self, loader: str, validate: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.loader = loader
        self.validate = validate
        self.requested = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.layer(batch[0]).sum(), sync_dist=True)

    def train_dataloader(self) -> DataLoader[Any]:
        self.requested += 1
        return make_loader(self.loader)

    def val_dataloader(self) -> DataLoader[Any]:
        self.requested += 1
        return make_loader("plain")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def make_loader(kind: str) -> DataLoader[Any]:
    dataset = TensorDataset(torch.arange(16.0).reshape(8, 2))
    if kind == "cuda_generator":  # the DataLoader's own generator
        return DataLoader(dataset, batch_size=2, shuffle=True, generator=ReportsCuda())
    if kind == "cuda_sampler_generator":  # a sampler's generator, kept by use_distributed_sampler=False
        return DataLoader(dataset, batch_size=2, sampler=RandomSampler(dataset, generator=ReportsCuda()))
    if kind == "cpu_generator":
        return DataLoader(dataset, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(0))
    if kind == "own_sampler":
        return DataLoader(dataset, batch_size=2, sampler=OwnSampler(len(dataset)))
    return DataLoader(dataset, batch_size=2, shuffle=kind == "shuffle")


def fit(
    root: str,
    loader: str,
    *,
    strategy: str = "ours",
    around: str = "nothing",
    validate: bool = False,
    max_epochs: int = 1,
    reload: bool = False,
    distributed_sampler: bool = True,
) -> dict[str, Any]:
    """One ``Trainer.fit`` on this rank, inside ``around`` (``"meta"``: ``torch.device("meta")``; ``"init_module"``:
    ``trainer.init_module()``; ``"model_only"``: the model built inside ``init_module``, fit outside)."""
    trainer = L.Trainer(
        accelerator="cpu",
        devices=torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        strategy=PolicyDDPStrategy() if strategy == "ours" else "ddp",
        max_epochs=max_epochs,
        limit_val_batches=1 if validate else 0,
        num_sanity_val_steps=0,
        reload_dataloaders_every_n_epochs=int(reload),
        use_distributed_sampler=distributed_sampler,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    checks = unittest.mock.patch.object(SetupChecks, "_find", autospec=True, side_effect=SetupChecks._find)
    with warnings.catch_warnings(record=True) as caught, checks as counted:
        warnings.simplefilter("always", InitModuleWarning)
        if around == "model_only":
            with trainer.init_module():
                module = LoaderModule(loader, validate)
        else:
            module = LoaderModule(loader, validate)
        with _around(trainer, around):
            trainer.fit(module)
    return {
        "rank": trainer.global_rank,
        "steps": trainer.global_step,
        "requested": module.requested,
        "checked": counted.call_count,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, InitModuleWarning)],
    }


@contextlib.contextmanager
def _around(trainer: L.Trainer, around: str) -> Iterator[None]:
    if around == "meta":
        with torch.device("meta"):
            yield
    elif around == "init_module":
        with trainer.init_module():
            yield
    else:
        yield
