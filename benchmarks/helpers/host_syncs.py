"""Counting host-device synchronizations: the calls that make the host wait for a device's result.

A synchronization is ``aten._local_scalar_dense``, what ``item()``, ``tolist()`` and a tensor's truth value call,
counted by a ``TorchDispatchMode`` in the thread that enters it. On CPU tensors the same calls are counted: the CPU is
the GPU's proxy for what a code path would synchronize.
"""

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HOST_SYNC", "HostSyncCount", "count_host_syncs"]

HOST_SYNC = "host_sync"  # the name the calls are counted under


class HostSyncCount(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A dispatch mode that counts, under :data:`HOST_SYNC` in :attr:`counts`, the synchronizing calls it sees."""

    def __init__(self, counts: "Counter[str]") -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            self.counts[HOST_SYNC] += 1
        return func(*args, **(kwargs or {}))


def count_host_syncs(counts: "Counter[str] | None" = None) -> HostSyncCount:
    """Count the synchronizing calls made in this thread inside the block (``with``), into ``counts`` or a new
    counter.

    Example:
        >>> with count_host_syncs() as counting:
        ...     _ = torch.ones(2).sum().item()
        >>> counting.counts[HOST_SYNC]
        1

    """
    return HostSyncCount(Counter() if counts is None else counts)
