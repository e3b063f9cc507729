"""Per-rank telemetry: each training batch timed by phase, the rank's memory sampled, rows to its own file."""

import json
import math
import multiprocessing
import os
import socket
import warnings
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from time import monotonic
from typing import Any

import psutil

from lightning_ext._files.csv_format import (
    CUDA_ALLOCATED_BYTES,
    CUDA_PEAK_BYTES,
    HOST_SUFFIX,
    HOST_USED_BYTES,
    RSS_BYTES,
    TIME_COLUMNS,
    WORKERS_RSS_BYTES,
)
from lightning_ext._files.storage import guarded, write_whole
from lightning_ext._telemetry.step_timer import COLLECTIVES, DATA_WAIT, GradientWait, StepTimer, timing
from lightning_ext.errors import RankMetricsWarning

__all__ = ["Telemetry", "WindowRow", "host_record"]

MEMORY_EVERY_S = 1.0  # memory is read at most this often: psutil's reads of /proc cost 30-150 µs of CPU
HOST_FORMAT = "lightning-ext per-rank host/1"
# where a rank waits for the others outside the strategy's own methods: Lightning's broadcast at each batch's start
# (the training epoch loop's), DDP's broadcast of the module's buffers at each forward (the DDP module's)
_WAITS = {"loop": "_broadcast_sigterm_tensor", "model": "_sync_buffers"}
WindowRow = tuple[int, dict[str, float]]  # a telemetry row of the live straggler window: (step, the TIME_COLUMNS)


class _Memory:
    """The rank's memory in bytes: its process, its multiprocessing children (DataLoader workers), its host, CUDA."""

    def __init__(self, cuda_device: Any | None) -> None:
        self._process = psutil.Process()
        self._children: dict[int, psutil.Process] = {}
        self._cuda_device = cuda_device
        self._read_at = -math.inf

    def sample(self, *, now: bool = False) -> dict[str, int]:
        """The memory columns, or none if they were read less than :data:`MEMORY_EVERY_S` ago (``now``: read)."""
        clock = monotonic()
        if not now and clock - self._read_at < MEMORY_EVERY_S:
            return {}
        self._read_at = clock
        host = psutil.virtual_memory()
        row = {RSS_BYTES: self._process.memory_info().rss, WORKERS_RSS_BYTES: self._workers(), HOST_USED_BYTES: 0}
        row[HOST_USED_BYTES] = host.total - host.available
        if self._cuda_device is not None:
            import torch

            row[CUDA_ALLOCATED_BYTES] = torch.cuda.memory_allocated(self._cuda_device)
            row[CUDA_PEAK_BYTES] = torch.cuda.max_memory_allocated(self._cuda_device)
        return row

    def _workers(self) -> int:
        # multiprocessing's children of this process are its DataLoader workers whatever their start method; the
        # other ranks are not among them (Lightning's launcher starts them with subprocess, torchrun from outside)
        pids = {child.pid for child in multiprocessing.active_children() if child.pid is not None}
        total = 0
        for pid in pids:
            process = self._children.get(pid) or self._children.setdefault(pid, psutil.Process(pid))
            try:
                total += process.memory_info().rss
            except psutil.Error:  # ended since (an epoch's workers stop), or not readable
                pids.discard(pid)
        for pid in set(self._children) - pids:
            del self._children[pid]
        return total


class Telemetry:
    """One rank's telemetry during ``fit``: hooks on the training epoch loop, a row every ``every_n_steps`` steps.

    :meth:`attach` shadows methods of the trainer's training epoch loop with instance attributes that call them:
    ``advance`` (one batch), ``_on_before_fetch`` and ``_on_after_fetch`` (Lightning's own timing points around each
    fetch, copied into the data fetcher every epoch), and the broadcast at each batch's start; and a DDP module's
    broadcast of its buffers. :meth:`detach` removes them. The strategy times its own ``training_step``,
    ``backward`` (with :attr:`gradient_wait`), ``optimizer_step`` and collectives with :attr:`timer`. Any error here
    stops telemetry on this rank with one :class:`~lightning_ext.errors.RankMetricsWarning`; training goes on.

    Args:
        logger: the rank's per-rank logger (``log_telemetry``, ``path``).
        rank: the global rank.
        every_n_steps: a row every this many steps; ``None``: the trainer's ``log_every_n_steps``.
        cuda_device: the rank's CUDA device, for its memory columns, or ``None``.
        window: how many of its latest rows the rank keeps in :attr:`window` for the live straggler verdict (the
            first row of the fit, which holds the warm-up, is not among them).

    """

    def __init__(
        self, logger: Any, rank: int, every_n_steps: int | None, cuda_device: Any | None = None, window: int = 0
    ) -> None:
        self.timer = StepTimer()
        self.gradient_wait = GradientWait(self.timer)
        self.window: deque[WindowRow] = deque(maxlen=window)
        self.row_written: Callable[[], None] = _nothing  # set by the owner: called after each row (the live verdict)
        self.detaching: Callable[[], None] = _nothing  # and first in :meth:`detach` (the live verdict's stop)
        self._logger = logger
        self._rank = rank
        self._every = every_n_steps
        self._memory = _Memory(cuda_device)
        self._shadowed: list[tuple[Any, str, Any]] = []  # (object, attribute, its instance attribute before, if any)
        self._last_step: int | None = None
        self._epoch = 0
        self._rows = 0

    def attach(self, trainer: Any) -> None:
        """Start timing ``trainer``'s training batches, and write this rank's host record."""
        with guarded() as failure:
            loop = trainer.fit_loop.epoch_loop
            every = self._every or int(trainer.log_every_n_steps) or 1
            before, after, advance = loop._on_before_fetch, loop._on_after_fetch, loop.advance
            write_whole(self._logger.path + HOST_SUFFIX, json.dumps(host_record(self._rank)).encode())
        if failure.error is not None:
            self._stop(failure.error, "starting")
            return
        timer = self.timer

        def on_before_fetch() -> None:
            timer.begin()
            before()

        def on_after_fetch() -> None:
            after()
            timer.end(DATA_WAIT)

        def timed_advance(data_fetcher: Any) -> None:
            timer.begin_batch()
            try:
                advance(data_fetcher)
            except BaseException:
                timer.end_batch(count=False)  # no batch (the data ran out) or a failed one
                raise
            timer.end_batch()
            self._after_batch(loop, every)

        self._shadow(loop, "_on_before_fetch", on_before_fetch)
        self._shadow(loop, "_on_after_fetch", on_after_fetch)
        self._shadow(loop, "advance", timed_advance)
        for owner, name in ((loop, _WAITS["loop"]), (getattr(trainer.strategy, "model", None), _WAITS["model"])):
            waiting = getattr(owner, name, None)
            if callable(waiting):
                self._shadow(owner, name, _timed_collective(timer, waiting))

    def detach(self) -> None:
        """Write the batches timed since the last row, and give the loop and the model their own methods back."""
        detaching, self.detaching = self.detaching, _nothing
        detaching()
        shadowed, self._shadowed = self._shadowed, []
        if not shadowed:
            return
        for owner, name, before in reversed(shadowed):
            if before is None:
                owner.__dict__.pop(name, None)
            else:
                owner.__dict__[name] = before
        if self._last_step is not None:
            with guarded() as failure:
                self.write_row(self._last_step, memory_now=True)
            if failure.error is not None:
                self._warn(failure.error, "writing its last row")

    def _shadow(self, owner: Any, name: str, replacement: Any) -> None:
        self._shadowed.append((owner, name, owner.__dict__.get(name)))
        owner.__dict__[name] = replacement

    def _after_batch(self, loop: Any, every: int) -> None:
        with guarded() as failure:
            step = int(loop._batches_that_stepped)  # the step of Lightning's own row for this batch
            self._last_step, self._epoch = step, int(loop.trainer.current_epoch)
            if (step + 1) % every == 0:  # as Lightning's should_update_logs decides
                self.write_row(step)
                self.row_written()
        if failure.error is not None:
            self._stop(failure.error, "sampling")

    def write_row(self, step: int, *, memory_now: bool = False) -> None:
        """Write the means of the batches timed since the last row as the row of ``step``, with the memory now if it
        was last read :data:`MEMORY_EVERY_S` ago or more (``memory_now``: in any case)."""
        times = self.timer.take()
        if not times:
            return
        if self._rows:  # the first row holds the warm-up: not a straggler's doing
            self.window.append((step, {name: times[name] for name in TIME_COLUMNS}))
        self._rows += 1
        row: dict[str, float | int] = dict(times)
        row.update(self._memory.sample(now=memory_now))
        row["epoch"] = self._epoch  # as Lightning adds to its rows
        self._logger.log_telemetry(row, step)

    def window_rows(self) -> list[WindowRow]:
        """The rows of :attr:`window`, copied (called by the watchdog's thread while the training thread appends)."""
        return list(self.window.copy())

    def read_memory(self) -> dict[str, int]:
        """The rank's memory columns, read now (what a row holds at most once a second)."""
        return self._memory.sample(now=True)

    def _stop(self, error: Exception, doing: str) -> None:
        self._last_step = None
        self.detach()
        self._warn(error, doing)

    def _warn(self, error: Exception, doing: str) -> None:
        warnings.warn(
            f"Per-rank telemetry of rank {self._rank} stopped: {type(error).__name__}: {error} (while {doing})."
            " Its metric rows go on; training is not affected.",
            RankMetricsWarning,
            stacklevel=3,
        )


def _timed_collective(timer: StepTimer, call: Callable[[], Any]) -> Callable[[], Any]:
    def timed_call() -> Any:
        with timing(timer, COLLECTIVES):
            return call()

    return timed_call


def _nothing() -> None:
    return None


def host_record(rank: int) -> dict[str, Any]:
    """What a rank's host record holds (``<file>.host``, written whole when telemetry starts)."""
    return {
        "format": HOST_FORMAT,
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "host_memory_bytes": psutil.virtual_memory().total,
        "cpu_count": os.cpu_count(),
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
