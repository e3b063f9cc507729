"""Counting the collective operations a piece of code makes, so that costs are counted rather than assumed.

Lightning, torchmetrics and lightning-ext all call collectives through the ``torch.distributed`` module
(``torch.distributed.all_reduce(...)``), and those functions are what is counted: the real operation still runs.
Collectives that torch makes from C++ (the DDP gradient buckets) are not counted, and a call such as
``all_gather_object`` counts once, although it exchanges twice on the wire. Lightning's barrier that lightning-ext's
counting wrapper skips for the training thread (the ranks were lined up) makes no collective and is not counted.
lightning-ext's hang checks talk over gloo groups of their own, not through those functions: each check is counted as
``"check"``.
"""

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from lightning_ext._collective import CheckChannel
from lightning_ext._torch_collectives import COLLECTIVES as TORCH_COLLECTIVES
from lightning_ext._torch_collectives import POINT_TO_POINT
from lightning_ext._watch.facts import barrier_skipped_now

__all__ = ["COLLECTIVES", "count_bytes", "count_collectives"]

COLLECTIVES = (*TORCH_COLLECTIVES, *POINT_TO_POINT)  # every exchange, a point-to-point one too


@contextmanager
def count_collectives() -> Iterator[Counter[str]]:
    """Count the ``torch.distributed`` collective calls made in this process inside the block, by name.

    Example:
        >>> with count_collectives() as counts:
        ...     pass
        >>> counts.total()
        0

    """
    counts: Counter[str] = Counter()
    originals: dict[str, Callable[..., Any]] = {}
    for name in COLLECTIVES:
        function = getattr(dist, name, None)
        if function is not None:
            originals[name] = function
            setattr(dist, name, _counted(function, name, counts))
    start = CheckChannel.start
    CheckChannel.start = _counted(start, "check", counts)  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        CheckChannel.start = start  # type: ignore[method-assign]
        for name, function in originals.items():
            setattr(dist, name, function)


def _counted(function: Callable[..., Any], name: str, counts: Counter[str]) -> Callable[..., Any]:
    @functools.wraps(function)
    def counting(*args: Any, **kwargs: Any) -> Any:
        if name != "barrier" or not barrier_skipped_now():
            counts[name] += 1
        return function(*args, **kwargs)

    return counting


@contextmanager
def count_bytes() -> Iterator[Counter[str]]:
    """Sum, by name, the bytes of the tensor each collective call inside the block fills on this rank (its first
    argument: the in-place tensor of an all-reduce or broadcast, the output of an all-to-all or all-gather).

    Example:
        >>> with count_bytes() as sizes:
        ...     pass
        >>> sizes.total()
        0

    """
    sizes: Counter[str] = Counter()
    originals: dict[str, Callable[..., Any]] = {}
    for name in COLLECTIVES:
        function = getattr(dist, name, None)
        if function is not None:
            originals[name] = function
            setattr(dist, name, _measured(function, name, sizes))
    try:
        yield sizes
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)


def _measured(function: Callable[..., Any], name: str, sizes: Counter[str]) -> Callable[..., Any]:
    @functools.wraps(function)
    def measuring(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], torch.Tensor):
            sizes[name] += args[0].numel() * args[0].element_size()
        return function(*args, **kwargs)

    return measuring
