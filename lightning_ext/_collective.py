"""The only module of lightning-ext that talks to other ranks (``docs/internals.md``)."""

import contextlib
import os
import pickle
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from lightning_ext._exchange_rounds import exchange_partners
from lightning_ext._network import Place

__all__ = [
    "FILLED",
    "STORE_ERRORS",
    "CheckChannel",
    "CheckExchange",
    "RankGroup",
    "StoreClient",
    "abort_process_groups",
    "agree_in_store",
    "all_gather_objects",
    "default_store",
    "gather_in_store",
    "gather_rows",
    "is_communication_failure",
    "is_initialized",
    "is_world",
    "release_store_clients",
    "store_client",
    "store_host",
    "training_timeout",
    "wait_for",
]

_STORE_TIMEOUT = timedelta(minutes=30)
# what a store raises when it is gone (its server's process ended) or a wait times out: torch.distributed's
# DistNetworkError and DistStoreError, RuntimeErrors, as is an operation a store lacks (NotImplementedError)
STORE_ERRORS: tuple[type[Exception], ...] = (RuntimeError,)
_GATHER_TIMEOUT = timedelta(seconds=60)


@dataclass(frozen=True)
class RankGroup:
    """The ranks that take part in a decision (``world_size``), this one's ``rank``, the ``device`` where the packed
    tensor lives (the strategy's root device) and the process ``group`` (``None``: the default, world group)."""

    world_size: int
    rank: int
    device: torch.device
    group: Any | None = None

    @classmethod
    def from_strategy(cls, strategy: Any) -> "RankGroup":
        """The world of a Lightning strategy: ``world_size``, ``global_rank`` and ``root_device``."""
        return cls(world_size=int(strategy.world_size), rank=int(strategy.global_rank), device=strategy.root_device)


def gather_rows(row: list[int], ranks: RankGroup) -> list[list[int]]:
    """Every rank's ``row`` (int64, the same length on every rank), in rank order: one ``all_to_all_single``, one round
    of messages whose cost does not grow with the row's length as a ring all-reduce's does (none at world size 1)."""
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


class CheckChannel:
    """This rank's links for the hang checks: a recursive-doubling exchange of ``(min, max)`` over pairs of ranks.

    Each check passes one 62-bit value per rank; every rank learns the smallest and the largest, so every rank reaches
    the same verdict (they agree exactly when the two are equal). In round ``i`` each rank swaps its running
    ``(min, max)`` with the rank whose number differs in bit ``i``: ``ceil(log2 W)`` messages per rank in as many
    rounds, as gloo's dissemination barrier (two more beyond the largest power of two, whose ranks fold into a partner);
    gloo's all-reduce is a ring of ``2 (W - 1)`` (docs/hang-checks.md, "Cost at scale"). Each pair talks over a two-rank
    gloo group of its own, apart from the training group: a check can never pair with a training collective.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.rounds = exchange_partners(rank, world_size)
        self.partner: int | None = None  # the partner being connected (a failure's, when connect raised)
        self._groups: dict[int, Any] = {}
        self._options = dist.AllToAllOptions()
        self._options.timeout = training_timeout()  # each exchange may wait as long as a training collective
        # one pair of buffers for every round of every check, written and read through numpy views: torch ops on
        # the check's path delayed each check by about 80 µs (2 ranks, 2 cores). Rounds run one after the other, so
        # a round's buffers are free once its work completed.
        self._buffers: _Buffers | None = _check_buffers()

    def connect(self, store: Any, place: Place, timeout: float) -> None:
        """Connect every pair through ``store`` (under the run's namespace), bound to ``place``, within ``timeout`` s.

        Raises:
            RuntimeError: gloo's, naming the peer's address: a pair did not connect in time (:attr:`partner`'s).

        """
        devices = _devices(place)
        deadline = time.monotonic() + timeout
        for partner in dict.fromkeys(self.rounds):
            self.partner, (low, high) = partner, sorted((self.rank, partner))
            options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            options._devices, options._threads = devices, 1  # one device, one loop thread, for every pair
            options._timeout = timedelta(seconds=max(0.001, deadline - time.monotonic()))
            pair_store = PrefixStore(f"pair/{low}-{high}/", store)
            self._groups[partner] = dist.ProcessGroupGloo(pair_store, int(self.rank == high), 2, options)
        self.partner = None

    def start(self, value: int) -> "CheckExchange":
        """Start passing ``value``; the returned exchange completes once every round has."""
        return CheckExchange(self, value)

    def fill(self) -> None:
        """Play this rank's part in a check it never started (its peers wait in it): :data:`FILLED` in every round,
        which the peers' exchanges then report (:attr:`CheckExchange.filled`)."""
        self._buffers = None  # a round started here may still be in flight later: fresh buffers from now on
        CheckExchange(self, FILLED).abandon()

    def close(self) -> None:
        """Drop the pair groups (their connections close)."""
        self._groups.clear()

    def _swap(self, partner: int, low: int, high: int) -> tuple[Any, Any]:
        """Send ``(low, high)`` to ``partner``; returns what receives the partner's (a numpy view) and the work."""
        sent, received, sent_view, received_view = self._buffers or _check_buffers()
        sent_view[0], sent_view[1], sent_view[2], sent_view[3] = low, high, low, high
        work = self._groups[partner].alltoall_base(received, sent, [], [], self._options)
        return received_view, work


FILLED = -1  # what a filler passes: below every fingerprint (they are not negative), so every rank's minimum keeps it


class CheckExchange:
    """One check in flight on a :class:`CheckChannel`: its rounds are started one after the other by :meth:`wait`."""

    def __init__(self, channel: CheckChannel, value: int) -> None:
        self.channel = channel
        self.low = self.high = value
        self._round = 0
        self._pending: tuple[int, Any, Any] | None = None
        self._start_round()

    @property
    def agreed(self) -> bool:
        """Whether every rank passed the same value (read once :meth:`wait` returned ``True``)."""
        return self.low == self.high

    @property
    def filled(self) -> bool:
        """Whether some rank's watchdog played its part (the run is failing: read the posted error)."""
        return self.low == FILLED

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
            half = 0 if partner < self.channel.rank else 2
            self.low, self.high = min(self.low, int(received[half])), max(self.high, int(received[half + 1]))
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
                self.channel._swap(rounds[self._round], FILLED, FILLED)
        self._pending = None

    def _start_round(self) -> None:
        rounds = self.channel.rounds
        if self._round >= len(rounds):
            self._pending = None
            return
        partner = rounds[self._round]
        self._pending = (partner, *self.channel._swap(partner, self.low, self.high))


_Buffers = tuple[torch.Tensor, torch.Tensor, Any, Any]


def _check_buffers() -> _Buffers:
    """What a round sends and receives, ``(low, high)`` per rank of the pair (int64, on the CPU whatever the default
    device), and their numpy views."""
    sent = torch.zeros(4, dtype=torch.int64, device="cpu")
    received = torch.zeros(4, dtype=torch.int64, device="cpu")
    return sent, received, sent.numpy(), received.numpy()


def _devices(place: Place) -> list[Any]:
    """gloo's devices for ``place`` (one per named interface, else one bound to its address), connecting at set-up even
    with ``TORCH_GLOO_LAZY_INIT`` set: a pair that cannot connect must fail then."""
    gloo = dist.ProcessGroupGloo
    if place.interfaces:
        return [gloo.create_device(interface=name, lazy_init=False) for name in place.interfaces]
    if place.address:
        return [gloo.create_device(hostname=place.address, lazy_init=False)]
    return [gloo.create_default_device(lazy_init=False)]


def store_host() -> str | None:
    """The host of the default group's store, which every rank reached at set-up (``MASTER_ADDR``)."""
    root = _default_root()
    return str(root.host) if isinstance(root, TCPStore) else os.environ.get("MASTER_ADDR")


def agree_in_store(store: Any, key: str, rank: int, world_size: int, failure: str | None, timeout: float) -> str | None:
    """Every rank's outcome of a step: ``None`` where it succeeded on every rank, else the first failure (or how many
    reported within ``timeout`` s). The last rank to report writes it: a few store operations per rank at any size."""
    if failure is not None:
        store.compare_set(f"{key}/failed", "", failure)
    if int(store.add(f"{key}/reported", 1)) == world_size:
        failed = store.get(f"{key}/failed").decode() if store.check([f"{key}/failed"]) else ""
        store.set(f"{key}/outcome", failed)
    try:
        store.wait([f"{key}/outcome"], timedelta(seconds=timeout))
    except STORE_ERRORS:  # some rank never reported (the wait timed out: DistStoreError)
        reported = int(store.add(f"{key}/reported", 0))
        return f"only {reported} of {world_size} ranks reported within {timeout:.0f} s"
    outcome = store.get(f"{key}/outcome").decode()
    return outcome or None


def wait_for(work: Any, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``work``: ``True`` once it completed, ``False`` if it is still pending; raises
    ``RuntimeError`` where the collective itself failed (a peer closed its connection, ...)."""
    try:  # at least a millisecond: a timeout of 0 means "no timeout" to c10d, a wait for ever
        work.wait(timeout=timedelta(seconds=max(seconds, 0.001)))
    except RuntimeError:
        if not work.is_completed():
            return False
        work.wait()  # it completed just after the timeout: returns at once, or raises the collective's own error
    return True


def gather_in_store(store: Any, key: str, obj: Any, world_size: int, rank: int) -> list[Any]:
    """Every rank's ``obj`` under ``key``, in rank order, through the store (error paths only): ``world_size`` small
    store operations per rank, and no collective, so it works while the training group is blocked."""
    store.set(f"{key}/{rank}", pickle.dumps(obj))
    keys = [f"{key}/{other}" for other in range(world_size)]
    store.wait(keys, _GATHER_TIMEOUT)
    return [pickle.loads(store.get(name)) for name in keys]


def default_store(namespace: str) -> Any:
    """The default group's own store connection, under ``namespace`` (for the training thread: no new connection)."""
    return PrefixStore(namespace, _default_root())


def store_client(namespace: str) -> "StoreClient":
    """A store connection of this process's own, under ``namespace``, opened on first use (:class:`StoreClient`)."""
    return StoreClient(namespace)


class StoreClient:
    """A store connection to the default group's server, under a namespace, opened on first use or in the background.

    Its own, because a TCPStore client serves one request at a time (a watchdog blocked in ``wait`` on the default
    group's would stall the training thread's); reused once given back (:func:`release_store_clients`): opening one
    costs a reverse lookup of the server's address, which a slow resolver holds for 5 s, so set-up waits for none.
    """

    def __init__(self, namespace: str) -> None:
        self._namespace, self._lock = namespace, threading.Lock()
        self.opened: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._open(), name)

    def open_in_background(self) -> None:
        """Open the connection now, in a thread of its own: ready for the error path, and no wait for set-up."""
        threading.Thread(target=self._open_quietly, name="lightning-ext-store-client", daemon=True).start()

    def _open_quietly(self) -> None:
        # the group may be gone already (a short run's teardown): the first use opens it, or raises where it is handled
        with contextlib.suppress(ValueError, *STORE_ERRORS):
            self._open()

    def _open(self) -> Any:
        with self._lock:
            if self.opened is None:
                self.opened = PrefixStore(self._namespace, _root_store())
            return self.opened


def release_store_clients(clients: list[Any]) -> None:
    """Give the connections of ``clients`` (from :func:`store_client`) back for reuse; no thread may use them again."""
    root = _default_root()
    opened = [client.opened.underlying_store for client in clients if client.opened is not None]
    with _IDLE_LOCK:
        if _IDLE and _IDLE[0] is not root:  # another process group now: its server is another
            _IDLE.clear()
        if not _IDLE:
            _IDLE.append(root)
        _IDLE.extend(store for store in opened if isinstance(store, TCPStore))


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
    """Abort this rank's pending collectives on the training group, where the backend can (NCCL). A gloo collective
    fails as soon as the peer's process ends; aborting it would leave the group unusable for a later run."""
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
