"""The only module of lightning-ext that talks to other ranks.

A decision pays exactly one collective: :func:`all_reduce_row`, an all-reduce of one small, fixed-size tensor on the
strategy's device (never a pickled object). At world size 1 it returns the row untouched, with no communication.
:func:`all_gather_objects` exists only for paths that are already failing or run once at set-up (naming the ranks
that lack a metric, comparing configurations), where a pickled object is the clearest thing to send.
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from lightning_ext._exchange import Layout, Number

__all__ = ["RankGroup", "all_gather_objects", "all_reduce_row"]

_DTYPES = {"int64": torch.int64, "float64": torch.float64}
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


@dataclass(frozen=True)
class RankGroup:
    """The ranks that take part in a decision, and where this one sits.

    Attributes:
        world_size: how many ranks take part.
        rank: this process's rank in the group.
        device: where the packed tensor lives (the strategy's root device).
        group: the process group; ``None`` means the default (world) group.

    """

    world_size: int
    rank: int
    device: torch.device
    group: Any | None = None

    @classmethod
    def from_strategy(cls, strategy: Any) -> "RankGroup":
        """The world of a Lightning strategy: ``world_size``, ``global_rank`` and ``root_device``."""
        return cls(world_size=int(strategy.world_size), rank=int(strategy.global_rank), device=strategy.root_device)


def all_reduce_row(row: list[Number], layout: Layout, ranks: RankGroup) -> list[Number]:
    """Reduce one packed row across ranks (one all-reduce), or return it unchanged at world size 1."""
    if ranks.world_size == 1:
        return list(row)
    tensor = torch.tensor(row, dtype=_DTYPES[layout.dtype], device=ranks.device)
    dist.all_reduce(tensor, op=_OPS[layout.op], group=ranks.group)
    reduced: list[Number] = tensor.tolist()
    return reduced


def all_gather_objects(obj: Any, ranks: RankGroup) -> list[Any]:
    """Every rank's ``obj``, in rank order (pickled; only for error paths and one-off set-up checks)."""
    if ranks.world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(gathered, obj, group=ranks.group)
    return gathered
