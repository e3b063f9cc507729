"""What makes a dataloader fail at its first batch, found before it: a generator on another device; pure rules."""

import multiprocessing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler

__all__ = ["Draw", "dataset_failure", "failing_draws"]

_CPU = torch.device("cpu")
_CHILDREN = ("sampler", "batch_sampler", "_batch_sampler", "_sampler")  # wrappers: BatchSampler, Lightning's


@dataclass(frozen=True)
class Draw:
    """One random draw a loader makes when it is iterated, and the devices involved."""

    what: str
    generator: torch.device
    on: torch.device

    @property
    def fails(self) -> bool:
        """Whether it certainly fails: a generator draws only on its own device type, on the CPU and on CUDA (other
        devices are not judged), and nothing is drawn on ``meta`` (a meta tensor has no values)."""
        if self.on.type == "meta":
            return True
        return self.on.type in ("cpu", "cuda") and self.generator.type != self.on.type


def failing_draws(loader: Any, default: torch.device) -> list[Draw]:
    """The draws of ``loader`` that fail when it is iterated with ``default`` as the default device.

    PyTorch's own classes only: a ``DataLoader`` draws its base seed with its ``generator`` on the default device;
    ``RandomSampler`` and a shuffling ``DistributedSampler`` permute on the default device with their generator (a
    fresh CPU one when none is given); ``SubsetRandomSampler`` uses its generator, if any, there too;
    ``WeightedRandomSampler`` draws on its weights' device. A draw on the CPU or CUDA fails when its generator's device
    type is not the draw's ("Expected a 'cuda' device type for generator but found 'cpu'"); a draw on ``meta`` fails
    (its values cannot be read). Other devices and samplers of other classes are not judged (their draws cannot be
    known), so every draw found is a certain failure.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> failing_draws(DataLoader(range(4), shuffle=True), torch.device("cpu"))
        []
        >>> [draw.what for draw in failing_draws(DataLoader(range(4), shuffle=True), torch.device("meta"))]
        ['its DataLoader draws its seed on meta', 'its sampler (RandomSampler) permutes on meta with a CPU generator']

    """
    if not isinstance(loader, DataLoader):
        return []
    return [draw for draw in _draws(loader, default) if draw.fails]


def _draws(loader: "DataLoader[Any]", default: torch.device) -> Iterator[Draw]:
    generator = loader.generator  # the seed of every iterator is drawn with it (or the default device's own)
    if generator is not None:
        what = f"its DataLoader generator is on {generator.device} and draws its seed on {default}"
        yield Draw(what, generator.device, default)
    else:
        yield Draw(f"its DataLoader draws its seed on {default}", default, default)
    for name, sampler in _samplers(loader):
        yield from _sampler_draws(name, sampler, default)


def _samplers(loader: "DataLoader[Any]") -> Iterator[tuple[str, Any]]:
    """Every sampler reachable from the loader: its sampler and batch sampler, and what wrappers hold."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("its sampler", loader.sampler), ("its batch sampler", loader.batch_sampler)]
    while stack:
        name, sampler = stack.pop(0)
        if sampler is None or id(sampler) in seen or isinstance(sampler, (int, str)):
            continue
        seen.add(id(sampler))
        yield name, sampler
        children = [getattr(sampler, attribute, None) for attribute in _CHILDREN]
        wrapped = getattr(getattr(sampler, "dataset", None), "_sampler", None)  # Lightning's DistributedSamplerWrapper
        stack += [(f"{name}'s sampler", child) for child in [*children, wrapped] if child is not None]


def _sampler_draws(name: str, sampler: Any, default: torch.device) -> Iterator[Draw]:
    kind = type(sampler).__name__
    generator = getattr(sampler, "generator", None)
    if isinstance(sampler, DistributedSampler):
        if sampler.shuffle:
            yield Draw(f"{name} ({kind}, shuffle=True) permutes on {default} with a CPU generator", _CPU, default)
    elif isinstance(sampler, RandomSampler):
        device = _CPU if generator is None else generator.device
        which = "a CPU generator" if generator is None else f"its generator on {device}"
        yield Draw(f"{name} ({kind}) permutes on {default} with {which}", device, default)
    elif isinstance(sampler, SubsetRandomSampler) and generator is not None:
        yield Draw(
            f"{name} ({kind}) permutes on {default} with its generator on {generator.device}", generator.device, default
        )
    elif isinstance(sampler, WeightedRandomSampler) and generator is not None:
        on = sampler.weights.device
        yield Draw(f"{name} ({kind}) draws on {on} with its generator on {generator.device}", generator.device, on)


def dataset_failure(loader: Any, accelerator: bool) -> str | None:
    """Why ``loader`` fails at its first batch because its dataset holds tensors on an accelerator, or ``None``.

    Such a dataset works with ``num_workers=0`` and no pinning (data kept on the GPU is a choice); it fails when
    ``pin_memory=True`` on a machine with an accelerator (only CPU tensors can be pinned), or with worker processes
    forked from a process that uses CUDA (CUDA cannot be initialised again in a forked process).

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> loader = DataLoader(TensorDataset(torch.zeros(2, device="meta")), pin_memory=True)
        >>> print(dataset_failure(loader, accelerator=True))  # doctest: +ELLIPSIS
        its dataset holds tensors on meta, and pin_memory=True pins CPU tensors only: PyTorch would raise "cannot pin...
        >>> print(dataset_failure(loader, accelerator=False))  # no accelerator, nothing is pinned
        None

    """
    device = _tensor_device(getattr(loader, "dataset", None), depth=2)
    if device is None or device.type == "cpu":
        return None
    if getattr(loader, "pin_memory", False) and accelerator:
        return (
            f"its dataset holds tensors on {device}, and pin_memory=True pins CPU tensors only: PyTorch would raise"
            ' "cannot pin ... only dense CPU tensors can be pinned"'
        )
    workers = getattr(loader, "num_workers", 0)
    if device.type == "cuda" and workers > 0 and _start_method(loader) == "fork":
        return (
            f"its dataset holds tensors on {device}, and its {workers} worker process(es) are forked: PyTorch would"
            ' raise "Cannot re-initialize CUDA in forked subprocess"'
        )
    return None


def _tensor_device(dataset: Any, depth: int) -> torch.device | None:
    """The device of the first tensor not on the CPU that ``dataset`` holds (a ``TensorDataset``'s, a ``Subset``'s
    dataset's, or a tensor attribute), looking ``depth`` levels down; ``None`` if there is none."""
    if dataset is None or depth < 0:
        return None
    found = list(getattr(dataset, "tensors", ()))
    found += [value for value in getattr(dataset, "__dict__", {}).values() if isinstance(value, torch.Tensor)]
    for tensor in found:
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu":
            return tensor.device
    return _tensor_device(getattr(dataset, "dataset", None), depth - 1)


def _start_method(loader: Any) -> str:
    context = getattr(loader, "multiprocessing_context", None)
    if isinstance(context, str):
        return context
    if context is not None:
        method: str = context.get_start_method()
        return method
    return str(multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method())
