"""The rules that predict a dataloader's failure at its first batch, in one process, and the error's message."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from lightning.pytorch.overrides.distributed import _IndexBatchSamplerWrapper
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

from lightning_ext._setup.checks import Finding, init_module_warning, setup_message
from lightning_ext._setup.loaders import dataset_failure, failing_draws
from tests.helpers.setup_scenarios import OwnSampler, ReportsCuda

CPU, CUDA, META = torch.device("cpu"), torch.device("cuda", 0), torch.device("meta")
DATA = TensorDataset(torch.arange(8.0))


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(4))


def what(loader: Any, default: torch.device) -> list[str]:
    return [draw.what for draw in failing_draws(loader, default)]


@pytest.mark.parametrize(
    ("loader", "on_cpu", "on_cuda"),
    [
        (DataLoader(DATA), [], []),
        (DataLoader(DATA, shuffle=True), [], ["its sampler (RandomSampler) permutes on cuda:0 with a CPU generator"]),
        (
            DataLoader(DATA, shuffle=True, generator=ReportsCuda()),  # a CUDA generator works only where all is CUDA
            [
                "its DataLoader generator is on cuda:0 and draws its seed on cpu",
                "its sampler (RandomSampler) permutes on cpu with its generator on cuda:0",
            ],
            [],
        ),
        (
            DataLoader(DATA, sampler=DistributedSampler(DATA, num_replicas=2, rank=0)),
            [],
            ["its sampler (DistributedSampler, shuffle=True) permutes on cuda:0 with a CPU generator"],
        ),
        (DataLoader(DATA, sampler=DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=False)), [], []),
        (
            DataLoader(DATA, batch_sampler=BatchSampler(RandomSampler(DATA, generator=ReportsCuda()), 2, False)),
            ["its batch sampler's sampler (RandomSampler) permutes on cpu with its generator on cuda:0"],
            [],
        ),
        (
            DataLoader(DATA, sampler=SubsetRandomSampler([0, 1], generator=ReportsCuda())),
            ["its sampler (SubsetRandomSampler) permutes on cpu with its generator on cuda:0"],
            [],
        ),
        (DataLoader(DATA, sampler=SubsetRandomSampler([0, 1])), [], []),  # the default device's own generator
        (
            DataLoader(DATA, sampler=WeightedRandomSampler([0.5, 0.5], 2, generator=ReportsCuda())),
            ["its sampler (WeightedRandomSampler) draws on cpu with its generator on cuda:0"],
            ["its sampler (WeightedRandomSampler) draws on cpu with its generator on cuda:0"],  # weights on the CPU
        ),
        (DataLoader(DATA, sampler=OwnSampler(8)), [], []),  # not a sampler of PyTorch's: not judged
        (DataLoader(Stream()), [], []),
        (
            DataLoader(DATA, sampler=DistributedSamplerWrapper(RandomSampler(DATA, generator=ReportsCuda()), 2, 0)),
            ["its sampler's sampler (RandomSampler) permutes on cpu with its generator on cuda:0"],
            ["its sampler (DistributedSamplerWrapper, shuffle=True) permutes on cuda:0 with a CPU generator"],
        ),
    ],
    ids=[
        "sequential",
        "shuffle",
        "cuda-generator",
        "distributed",
        "distributed-no-shuffle",
        "batch-sampler",
        "subset",
        "subset-default",
        "weighted",
        "own-sampler",
        "stream",
        "lightning-wrapper",
    ],
)
def test_which_draws_fail_on_a_cpu_and_on_a_cuda_default_device(
    loader: Any, on_cpu: list[str], on_cuda: list[str]
) -> None:
    assert what(loader, CPU) == on_cpu
    assert what(loader, CUDA) == on_cuda


def test_lightnings_predict_wrapper_is_looked_through() -> None:
    loader = DataLoader(DATA, batch_size=2, shuffle=True, generator=torch.Generator())
    wrapped = DataLoader(DATA, batch_sampler=_IndexBatchSamplerWrapper(BatchSampler(RandomSampler(DATA), 2, False)))
    assert what(loader, CPU) == [] and what(wrapped, CPU) == []
    assert "RandomSampler) permutes on cuda:0 with a CPU generator" in what(wrapped, CUDA)[0]


def test_on_meta_every_loader_fails_and_other_devices_are_not_judged() -> None:
    assert what(DataLoader(DATA), META) == ["its DataLoader draws its seed on meta"]
    assert what(DataLoader(DATA, shuffle=True), torch.device("xpu")) == []  # not known: never a false alarm
    assert what(SequentialSampler(DATA), CPU) == []  # not a DataLoader


def test_a_dataset_on_an_accelerator_fails_only_when_pinned_or_forked() -> None:
    on_meta = TensorDataset(torch.zeros(4, device="meta"))
    assert dataset_failure(DataLoader(on_meta), accelerator=True) is None  # kept on the device: a choice
    assert dataset_failure(DataLoader(on_meta, pin_memory=True), accelerator=False) is None  # nothing is pinned
    assert "pin_memory=True pins CPU tensors only" in str(dataset_failure(DataLoader(on_meta, pin_memory=True), True))
    assert dataset_failure(DataLoader(DATA, pin_memory=True), accelerator=True) is None
    assert dataset_failure(DataLoader(on_meta, num_workers=2), accelerator=True) is None  # only CUDA breaks in a fork


def test_the_message_names_each_rank_the_loader_the_cause_and_the_fix() -> None:
    generator = Finding(
        "train dataloader",
        "M.train_dataloader, model.py:12",
        ("its DataLoader generator ...",),
        "generator",
        "fit",
        "cuda",
        "cpu",
    )
    message = setup_message([[], [generator], [generator]])
    assert (
        message.splitlines()[1]
        == "  ranks 1 and 2: the train dataloader (M.train_dataloader, model.py:12): its DataLoader generator ..."
    )
    assert "Expected a 'cpu' device type for generator but found 'cuda'" in message
    init = Finding("val dataloader 0", "", ("its sampler ...",), "init_module", "validate", "cpu", "cuda")
    message = setup_message([[init]])
    assert "The run is inside `with trainer.init_module():`, where the default device is cuda" in message
    assert "Expected a 'cuda' device type for generator but found 'cpu'" in message
    assert message.endswith("then call trainer.validate() (and build your data) after the `with` block.")
    dataset = Finding("train dataloader", "", ("its dataset holds tensors on cuda:0, ...",), "dataset")
    assert "Fix: build the dataset outside trainer.init_module()" in setup_message([[dataset], []])


def test_the_init_module_warning_names_the_ranks_inside() -> None:
    assert init_module_warning([None, None]) is None
    warning = init_module_warning([("fit", "cuda:0"), None])
    assert warning is not None and str(warning).startswith(
        "trainer.fit() runs inside `with trainer.init_module():` on rank 0 (the default device there is cuda:0)"
    )
