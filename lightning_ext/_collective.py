"""The only module of lightning-ext that talks to other ranks (``docs/internals.md``)."""

import contextlib
import pickle
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from lightning_ext._exchange_rounds import CARRY_BYTES, COMBINE, TAKE, Carried, exchange_partners, roles

__all__ = [
    "STORE_ERRORS",
    "CheckChannel",
    "CheckExchange",
    "RankGroup",
    "abort_process_groups",
    "all_gather_objects",
    "exact_mean_input",
    "gather_in_store",
    "gather_rows",
    "is_communication_failure",
    "is_gloo",
    "is_initialized",
    "is_world",
    "release_store_clients",
    "store_client",
    "training_timeout",
    "wait_for",
]

_STORE_TIMEOUT = timedelta(minutes=30)
# what a store raises when it is gone (its server's process ended) or a wait times out: torch.distributed's
# DistNetworkError and DistStoreError, RuntimeErrors, as is an operation a store lacks (NotImplementedError)
STORE_ERRORS: tuple[type[Exception], ...] = (RuntimeError,)
_GATHER_TIMEOUT = timedelta(seconds=60)
_ALL_TO_ALL = dist.AllToAllOptions()
_SLOTS = 2 + CARRY_BYTES // 8  # int64 slots of one rank's half of a round's message: (low, high), then the carried


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


def is_gloo() -> bool:
    """Whether the default process group is gloo's (where Lightning's mean is a sum divided by the world size)."""
    return bool(is_initialized() and dist.get_backend() == "gloo")


def is_initialized() -> bool:
    """Whether the default process group exists (and has not been torn down)."""
    return bool(dist.is_available() and dist.is_initialized())


def is_world(group: Any) -> bool:
    """Whether ``group`` means every rank: ``None`` (the default group) or ``torch.distributed.group.WORLD``."""
    return group is None or (is_initialized() and group is dist.group.WORLD)


class CheckChannel:
    """This rank's links for the hang checks: a recursive-doubling exchange of ``(min, max)`` over pairs of ranks.

    Each check passes one 62-bit value per rank; every rank learns the smallest and the largest, so every rank reaches
    the same verdict (they agree exactly when the two are equal). In round ``i`` each rank swaps its running
    ``(min, max)`` with the rank whose number differs in bit ``i``, so a check costs ``ceil(log2 W)`` messages per rank
    in as many rounds, like gloo's dissemination barrier that it replaces (two more for the ranks beyond the largest
    power of two, which fold their value into a partner first and take the result back last). Each pair talks over a
    two-rank gloo group of its own, created through the store by the two ranks alone, apart from the training group:
    a check can never pair with a collective of the training group.

    Every message has the same size, :data:`CARRY_BYTES` more than the ``(min, max)``: a check may carry values
    (:class:`Carried`), which the rounds reduce as they reduce the ``(min, max)`` (a recursive-doubling all-reduce), so
    a hook's step values sync within their check. They are read only where the check agreed.

    Args:
        store: the training thread's store client under the run's namespace (the pairs meet through it).
        rank: this rank.
        world_size: the number of ranks.

    """

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.rounds = exchange_partners(rank, world_size)
        self.roles = roles(rank, world_size)
        self._groups: dict[int, Any] = {}
        for partner in dict.fromkeys(self.rounds):
            low, high = sorted((rank, partner))
            pair_store = PrefixStore(f"pair/{low}-{high}/", store)
            self._groups[partner] = dist.ProcessGroupGloo(pair_store, int(rank == high), 2, training_timeout())
        # one pair of buffers for every round of every check, written and read through numpy views: torch ops on
        # the check's path delayed each check by about 80 µs (2 ranks, 2 cores). Rounds run one after the other, so
        # a round's buffers are free once its work completed.
        self._buffers: _Buffers | None = _check_buffers()

    def start(self, value: int, carried: Carried | None = None) -> "CheckExchange":
        """Start passing ``value`` (and ``carried``); the returned exchange completes once every round has."""
        return CheckExchange(self, value, carried)

    def fill(self) -> None:
        """Play this rank's part in a check it never started (its peers wait in it); nothing is read back."""
        self._buffers = None  # a round started here may still be in flight later: fresh buffers from now on
        exchange = CheckExchange(self, 0, None)
        exchange.abandon()

    def close(self) -> None:
        """Drop the pair groups (their connections close)."""
        self._groups.clear()

    def _swap(self, partner: int, low: int, high: int, carried: Carried | None) -> tuple[Any, Any]:
        """Send ``(low, high)`` and the carried values to ``partner``; returns what receives the partner's (a numpy
        view) and the work."""
        sent, received, sent_view, received_view = self._buffers or _check_buffers()
        sent_view[0], sent_view[1], sent_view[_SLOTS], sent_view[_SLOTS + 1] = low, high, low, high
        if carried is not None:
            payload = sent_view.view(np.uint8)
            payload[16 : 8 * _SLOTS] = carried.data
            payload[8 * _SLOTS + 16 :] = carried.data
        work = self._groups[partner].alltoall_base(received, sent, [], [], _ALL_TO_ALL)
        return received_view, work


class CheckExchange:
    """One check in flight on a :class:`CheckChannel`: its rounds are started one after the other by :meth:`wait`."""

    def __init__(self, channel: CheckChannel, value: int, carried: Carried | None) -> None:
        self.channel = channel
        self.low = self.high = value
        self.carried = carried
        self._round = 0
        self._pending: tuple[int, Any, Any] | None = None
        self._start_round()

    @property
    def agreed(self) -> bool:
        """Whether every rank passed the same value (read once :meth:`wait` returned ``True``)."""
        return self.low == self.high

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the remaining rounds: ``True`` once all completed, ``False`` if one is pending.

        Raises:
            RuntimeError: a round failed (a peer's process ended, ...).

        """
        deadline = time.monotonic() + seconds
        while self._pending is not None:
            partner, received, work = self._pending
            try:
                if not wait_for(work, max(0.0, deadline - time.monotonic())):
                    return False
            except RuntimeError:
                self.channel._buffers = None  # the failed round's buffers are not reused
                raise
            half = 0 if partner < self.channel.rank else _SLOTS
            self.low, self.high = min(self.low, int(received[half])), max(self.high, int(received[half + 1]))
            if self.carried is not None:
                self._carry(received.view(np.uint8)[8 * half + 16 : 8 * (half + _SLOTS)], partner)
            self._round += 1
            self._start_round()
        return True

    def abandon(self) -> None:
        """Start every remaining round at once without reading anything back, so that no peer waits on this rank."""
        rounds = self.channel.rounds
        self.channel._buffers = None  # the pending round may still read them: fresh buffers from now on
        while self._round < len(rounds):
            self._round += 1
            if self._round < len(rounds):
                self.channel._swap(rounds[self._round], 0, 0, None)
        self._pending = None

    def _carry(self, theirs: Any, partner: int) -> None:
        """Fold a partner's carried values into this rank's, as this round's role says."""
        assert self.carried is not None
        role = self.channel.roles[self._round]
        if role == COMBINE:
            self.carried.combine(theirs, first=self.channel.rank < partner)
        elif role == TAKE:
            self.carried.data[:] = theirs

    def _start_round(self) -> None:
        rounds = self.channel.rounds
        if self._round >= len(rounds):
            self._pending = None
            return
        partner = rounds[self._round]
        self._pending = (partner, *self.channel._swap(partner, self.low, self.high, self.carried))


_Buffers = tuple[torch.Tensor, torch.Tensor, Any, Any]


def _check_buffers() -> _Buffers:
    """What a round sends and receives, a half per rank of the pair (int64, on the CPU whatever the default device),
    and their numpy views."""
    sent = torch.zeros(2 * _SLOTS, dtype=torch.int64, device="cpu")
    received = torch.zeros(2 * _SLOTS, dtype=torch.int64, device="cpu")
    return sent, received, sent.numpy(), received.numpy()


def exact_mean_input(tensor: Any, reduce_op: Any) -> Any:
    """``tensor`` as a float tensor when ``strategy.reduce`` is asked for the mean of integers, else ``tensor``.

    Lightning's ``_sync_ddp`` divides an integer sum by the world size in place, truncating it: a logged mean's batch
    count, so a synced epoch mean is wrong when the ranks' batch-size totals differ (Lightning #21859). The mean of the
    same numbers as floats is exact.

    Example:
        >>> exact_mean_input(torch.tensor(7), "mean").dtype == torch.get_default_dtype()
        True
        >>> exact_mean_input(torch.tensor(7), "sum").dtype
        torch.int64

    """
    if (
        isinstance(tensor, torch.Tensor)
        and isinstance(reduce_op, str)
        and reduce_op.lower() in ("mean", "avg")
        and not (torch.is_floating_point(tensor) or torch.is_complex(tensor))
    ):
        return tensor.to(torch.get_default_dtype())
    return tensor


def wait_for(work: Any, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``work``: ``True`` once it completed, ``False`` if it is still pending.

    Raises:
        RuntimeError: the collective itself failed (a peer closed its connection, ...).

    """
    try:  # at least a millisecond: a timeout of 0 means "no timeout" to c10d, a wait for ever
        work.wait(timeout=timedelta(seconds=max(seconds, 0.001)))
    except RuntimeError:
        if not work.is_completed():
            return False
        work.wait()  # it completed just after the timeout: returns at once, or raises the collective's own error
    return True


def gather_in_store(store: Any, key: str, obj: Any, world_size: int, rank: int) -> list[Any]:
    """Every rank's ``obj`` under ``key``, in rank order, exchanged through the store (for error paths only).

    Each rank writes its own entry and reads everyone's: ``world_size`` small store operations per rank, and no
    collective, so it works while the training group is blocked.
    """
    store.set(f"{key}/{rank}", pickle.dumps(obj))
    keys = [f"{key}/{other}" for other in range(world_size)]
    store.wait(keys, _GATHER_TIMEOUT)
    return [pickle.loads(store.get(name)) for name in keys]


def store_client(namespace: str) -> Any:
    """A store connection of this process's own, under ``namespace``, to the server of the default process group.

    Its own connection, because a TCPStore client serves one request at a time: a watchdog blocked in ``wait`` on
    the default group's client would stall every store operation of the training thread. A connection given back by
    :func:`release_store_clients` is used again: opening one costs a reverse lookup of the server's address, which
    a slow resolver can hold for its whole timeout (5 s by default), in every run of a process that runs several.
    """
    return PrefixStore(namespace, _root_store())


def release_store_clients(clients: list[Any]) -> None:
    """Give the connections of ``clients`` (from :func:`store_client`) back for reuse; no thread may use them again."""
    root = _default_root()
    with _IDLE_LOCK:
        if _IDLE and _IDLE[0] is not root:  # another process group now: its server is another
            _IDLE.clear()
        if not _IDLE:
            _IDLE.append(root)
        _IDLE.extend(client.underlying_store for client in clients if isinstance(client.underlying_store, TCPStore))


_IDLE: list[Any] = []  # [the default group's root store, its idle client connections...]
_IDLE_LOCK = threading.Lock()


def _default_root() -> Any:
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store


def _root_store() -> Any:
    """A client of the default group's store server, idle or new (the store itself, if it is not a TCPStore)."""
    root = _default_root()
    if not isinstance(root, TCPStore):
        return root
    with _IDLE_LOCK:
        if len(_IDLE) > 1 and _IDLE[0] is root:
            return _IDLE.pop()
    return TCPStore(root.host, root.port, is_master=False, wait_for_workers=False, timeout=_STORE_TIMEOUT)


def training_timeout() -> timedelta:
    """The default process group's timeout (what ends a stuck collective of the training group), else 30 minutes."""
    group = dist.distributed_c10d._get_default_group()
    for device in ("cpu", "cuda"):
        # no backend for that device (RuntimeError), or a backend whose options do not say (private API)
        with contextlib.suppress(RuntimeError, AttributeError):
            timeout: timedelta = group._get_backend(torch.device(device)).options._timeout
            return timeout
    return _STORE_TIMEOUT


def abort_process_groups() -> None:
    """Abort this rank's pending collectives on the training group, where the backend can (NCCL, not gloo).

    A gloo collective cannot be aborted: it fails as soon as the peer's process ends, and aborting it would only
    leave the group unusable for a later run in the same process.
    """
    if is_initialized() and dist.get_backend() != "gloo":
        # a torch without the (private) abort, or a backend that cannot: its collectives then fail at its timeout
        with contextlib.suppress(AttributeError, RuntimeError):
            dist.distributed_c10d._abort_process_group()


def is_communication_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective or store operation failing (a peer went away), not a genuine error."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        marker in text for marker in ("Connection closed by peer", "Connection reset by peer", "gloo", "NCCL")
    )
