"""The CUDA cases of the set-up checks, where a GPU is present (skipped otherwise): a real CUDA generator, and a real
``trainer.init_module()`` around ``trainer.fit``; ours names the cause before the first batch, stock does not."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_ext import PolicyDDPStrategy
from lightning_ext.errors import DataLoaderSetupError

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class Model(L.LightningModule):
    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.generator = generator

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def train_dataloader(self) -> DataLoader[Any]:
        data = TensorDataset(torch.randn(8, 2, device="cpu"))
        return DataLoader(data, batch_size=2, shuffle=True, generator=self.generator)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(strategy: Any) -> L.Trainer:
    return L.Trainer(
        accelerator="gpu",
        devices=1,
        strategy=strategy,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def test_a_cuda_generator_is_named_before_the_first_batch() -> None:
    with pytest.raises(RuntimeError, match=r"Expected a '(cpu|cuda)' device type for generator"):
        trainer("auto").fit(Model(torch.Generator(device="cuda")))  # stock: PyTorch's error, at the first batch
    with pytest.raises(DataLoaderSetupError, match="its DataLoader generator is on cuda") as raised:
        trainer(PolicyDDPStrategy()).fit(Model(torch.Generator(device="cuda")))
    assert "Fix: drop the generator, or make it a CPU one" in str(raised.value)


def test_fit_inside_init_module_is_named_before_the_first_batch() -> None:
    stock = trainer("ddp")
    with pytest.raises(RuntimeError, match=r"Please call `iter\(combined_loader\)` first"), stock.init_module():
        stock.fit(Model())
    ours = trainer(PolicyDDPStrategy())
    with pytest.raises(DataLoaderSetupError) as raised, ours.init_module():
        ours.fit(Model())
    message = str(raised.value)
    assert "The run is inside `with trainer.init_module():`, where the default device is cuda" in message
    assert "Expected a 'cuda' device type for generator but found 'cpu'" in message
    assert "init_module is for building the model only" in message
    right = trainer(PolicyDDPStrategy())
    with right.init_module():  # the model built inside init_module, fit outside: runs
        model = Model()
    right.fit(model)
    assert right.global_step == 2
