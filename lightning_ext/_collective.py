"""The only module of lightning-ext that talks to other ranks (``docs/internals.md``)."""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

__all__ = [
    "RankGroup",
    "abort_process_groups",
    "all_gather_objects",
    "destroy_group",
    "gather_objects_in",
    "gather_rows",
    "is_communication_failure",
    "is_initialized",
    "is_world",
    "lightning_barrier_skipped",
    "side_group",
    "start_all_to_all",
    "store_client",
    "wait_for",
]

_STORE_TIMEOUT = timedelta(minutes=30)


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


def gather_rows(row: list[int], ranks: RankGroup) -> list[list[int]]:
    """Every rank's ``row`` (int64, the same length on every rank), in rank order: one ``all_to_all_single``.

    Each rank sends its row to every rank in one round of messages (W - 1 sent, W received per rank), so its cost
    does not grow with the row's length as a ring all-reduce's does. At world size 1, no communication.
    """
    if ranks.world_size == 1:
        return [list(row)]
    sent = torch.tensor(row * ranks.world_size, dtype=torch.int64, device=ranks.device)
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=ranks.group)
    flat: list[int] = received.tolist()
    size = len(row)
    return [flat[rank * size : (rank + 1) * size] for rank in range(ranks.world_size)]


def all_gather_objects(obj: Any, ranks: RankGroup) -> list[Any]:
    """Every rank's ``obj``, in rank order (pickled; only for error paths and one-off set-up checks)."""
    if ranks.world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(gathered, obj, group=ranks.group)
    return gathered


def is_initialized() -> bool:
    """Whether the default process group exists (and has not been torn down)."""
    return bool(dist.is_available() and dist.is_initialized())


def is_world(group: Any) -> bool:
    """Whether ``group`` means every rank: ``None`` (the default group) or ``torch.distributed.group.WORLD``."""
    return group is None or (is_initialized() and group is dist.group.WORLD)


def side_group() -> Any:
    """A gloo group over every rank, for lightning-ext's own checks (a collective: every rank must call it).

    Checks run there so that a check can never pair with another collective on the training group: a rank that
    waits in a check is never matched with a rank that went on into DDP's gradient all-reduce.
    """
    return dist.new_group(backend="gloo")


def start_all_to_all(value: int, group: Any, world_size: int) -> tuple[torch.Tensor, Any]:
    """The hang checks' all-to-all: start sending ``value`` to every rank of ``group``; returns the receiving tensor.

    An all-to-all: every rank's value arrives in one round of messages, where gloo's all-reduce passes a small
    tensor around its ring in about ``4 x world_size`` dependent steps (and its barrier in ``log2(world_size)``).
    Element ``r`` of the tensor is rank ``r``'s value, the same tensor on every rank once the work completes.
    """
    # on the CPU, whatever the default device (a run inside trainer.init_module() or `with torch.device(...)`)
    sent = torch.full((world_size,), value, dtype=torch.int64, device="cpu")
    received = torch.empty(world_size, dtype=torch.int64, device="cpu")
    work = dist.all_to_all_single(received, sent, group=group, async_op=True)
    return received, work


def wait_for(work: Any, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``work``: ``True`` once it completed, ``False`` if it is still pending.

    Raises:
        RuntimeError: the collective itself failed (a peer closed its connection, ...).

    """
    try:
        work.wait(timeout=timedelta(seconds=seconds))
    except RuntimeError:
        if work.is_completed():
            raise
        return False
    return True


def gather_objects_in(obj: Any, group: Any, world_size: int) -> list[Any]:
    """Every rank's ``obj`` on ``group``, in rank order (pickled; for error paths)."""
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def store_client(namespace: str) -> Any:
    """A store connection of this process's own, under ``namespace``, to the server of the default process group.

    Its own connection, because a TCPStore client serves one request at a time: a watchdog blocked in ``wait`` on
    the default group's client would stall every store operation of the training thread.
    """
    store = dist.distributed_c10d._get_default_store()
    root = store
    while isinstance(root, PrefixStore):
        root = root.underlying_store
    if isinstance(root, TCPStore):
        root = TCPStore(root.host, root.port, is_master=False, wait_for_workers=False, timeout=_STORE_TIMEOUT)
    return PrefixStore(namespace, root)


def destroy_group(group: Any) -> None:
    """Destroy a group created by :func:`side_group` (nothing if the process groups are already gone)."""
    if is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group(group)


@contextlib.contextmanager
def lightning_barrier_skipped() -> Iterator[None]:
    """Within the block, ``torch.distributed.barrier`` does nothing.

    Lightning's ``_sync_ddp`` runs a barrier before each all-reduce; a lightning-ext check has just lined the ranks up
    at the same call, so that barrier would only add a collective. The all-reduce itself still runs, as Lightning
    runs it.
    """
    barrier = dist.barrier
    dist.barrier = _no_barrier
    try:
        yield
    finally:
        dist.barrier = barrier


def _no_barrier(*args: Any, **kwargs: Any) -> None:
    return None


def abort_process_groups() -> None:
    """Abort this rank's pending collectives on the training group, where the backend can (NCCL, not gloo).

    A gloo collective cannot be aborted: it fails as soon as the peer's process ends, and aborting it would only
    leave the group unusable for a later run in the same process.
    """
    if is_initialized() and dist.get_backend() != "gloo":
        with contextlib.suppress(Exception):
            dist.distributed_c10d._abort_process_group()


def is_communication_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective or store operation failing (a peer went away), not a genuine error."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        marker in text for marker in ("Connection closed by peer", "Connection reset by peer", "gloo", "NCCL")
    )
