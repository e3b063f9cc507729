"""Per-rank telemetry: each training batch timed by phase, the rank's memory sampled, rows to its own file."""

import json
import math
import multiprocessing
import os
import socket
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from time import monotonic, perf_counter_ns
from types import TracebackType
from typing import Any, TypeVar

import psutil

from lightning_ext._per_rank.csv_format import (
    BACKWARD_S,
    COLLECTIVES_S,
    CUDA_ALLOCATED_BYTES,
    CUDA_PEAK_BYTES,
    DATA_WAIT_S,
    FORWARD_S,
    HOST_SUFFIX,
    HOST_USED_BYTES,
    OPTIMIZER_S,
    RSS_BYTES,
    STEP_S,
    WORKERS_RSS_BYTES,
)
from lightning_ext._per_rank.storage import write_whole
from lightning_ext.errors import RankMetricsWarning

__all__ = ["BACKWARD", "COLLECTIVES", "FORWARD", "OPTIMIZER", "StepTimer", "Telemetry", "timed", "timing"]

DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVES = range(5)
MEMORY_EVERY_S = 1.0  # memory is read at most this often: psutil's reads of /proc cost 30-150 µs of CPU
_PHASES = (DATA_WAIT_S, FORWARD_S, BACKWARD_S, OPTIMIZER_S, COLLECTIVES_S)
HOST_FORMAT = "lightning-ext per-rank host/1"
_Result = TypeVar("_Result")


class StepTimer:
    """Each training batch's time and its phases' own times, summed until :meth:`take` makes them a row.

    A phase's own time leaves out what ran nested in it (the closure inside ``optimizer_step``, a synced value's
    collective inside ``training_step``), so the phases add up to at most the step. Outside a batch nothing is
    timed: :meth:`begin` says whether it started a phase.
    """

    __slots__ = ("_batches", "_stack", "_step", "_totals")

    def __init__(self) -> None:
        self._stack: list[list[int]] = []  # [start, time of the phases nested in it]; the batch at the bottom
        self._totals = [0] * len(_PHASES)
        self._step = self._batches = 0

    def begin_batch(self) -> None:
        """A training batch starts (the training epoch loop's ``advance``)."""
        self._stack = [[perf_counter_ns(), 0]]

    def end_batch(self, *, count: bool = True) -> None:
        """The batch ended: its time is added (``count=False``: it did not run; its phases are added all the same)."""
        if self._stack:
            start = self._stack[0][0]
            self._stack = []
            if count:
                self._step += perf_counter_ns() - start
                self._batches += 1

    def begin(self) -> bool:
        """A phase starts within the batch; ``False`` (nothing started) outside one."""
        if not self._stack:
            return False
        self._stack.append([perf_counter_ns(), 0])
        return True

    def end(self, phase: int) -> None:
        """The phase :meth:`begin` started last has ended."""
        if len(self._stack) < 2:
            return
        start, nested = self._stack.pop()
        took = perf_counter_ns() - start
        self._totals[phase] += took - nested
        self._stack[-1][1] += took

    def take(self) -> dict[str, float]:
        """Seconds per batch of the step and of each phase since the last call (means), then start afresh."""
        batches = self._batches
        if not batches:
            return {}
        row = {STEP_S: self._step / batches / 1e9}
        row.update({name: total / batches / 1e9 for name, total in zip(_PHASES, self._totals, strict=True)})
        self._totals = [0] * len(_PHASES)
        self._step = self._batches = 0
        return row


def timed(timer: StepTimer | None, phase: int, call: Callable[..., _Result], *args: Any, **kwargs: Any) -> _Result:
    """``call(*args, **kwargs)``, its time counted in ``phase`` while a batch is being timed."""
    if timer is None or not timer.begin():
        return call(*args, **kwargs)
    try:
        return call(*args, **kwargs)
    finally:
        timer.end(phase)


class timing:
    """The block's time counted in ``phase`` while a batch is being timed."""

    __slots__ = ("_began", "_phase", "_timer")

    def __init__(self, timer: StepTimer | None, phase: int) -> None:
        self._timer, self._phase, self._began = timer, phase, False

    def __enter__(self) -> None:
        self._began = self._timer is not None and self._timer.begin()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._began and self._timer is not None:
            self._timer.end(self._phase)


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

    :meth:`attach` shadows three methods of the trainer's training epoch loop with instance attributes that call
    them: ``advance`` (one batch), ``_on_before_fetch`` and ``_on_after_fetch`` (Lightning's own timing points around
    each fetch, copied into the data fetcher every epoch). :meth:`detach` removes them. The strategy times its own
    ``training_step``, ``backward``, ``optimizer_step`` and collectives with :attr:`timer`. Any error here stops
    telemetry on this rank with one :class:`~lightning_ext.errors.RankMetricsWarning`; training goes on.
    """

    def __init__(self, logger: Any, rank: int, every_n_steps: int | None, cuda_device: Any | None = None) -> None:
        self.timer = StepTimer()
        self._logger = logger
        self._rank = rank
        self._every = every_n_steps
        self._memory = _Memory(cuda_device)
        self._loop: Any = None
        self._last_step: int | None = None
        self._epoch = 0

    def attach(self, trainer: Any) -> None:
        """Start timing ``trainer``'s training batches, and write this rank's host record."""
        try:
            loop = trainer.fit_loop.epoch_loop
            every = self._every or int(trainer.log_every_n_steps) or 1
            before, after, advance = loop._on_before_fetch, loop._on_after_fetch, loop.advance
            write_whole(self._logger.path + HOST_SUFFIX, json.dumps(host_record(self._rank)).encode())
        except Exception as error:
            self._stop(error, "starting")
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

        loop._on_before_fetch, loop._on_after_fetch, loop.advance = on_before_fetch, on_after_fetch, timed_advance
        self._loop = loop

    def detach(self) -> None:
        """Write the batches timed since the last row, and give the loop its own methods back."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        for name in ("_on_before_fetch", "_on_after_fetch", "advance"):
            loop.__dict__.pop(name, None)
        if self._last_step is not None:
            try:
                self.write_row(self._last_step, memory_now=True)
            except Exception as error:
                self._warn(error, "writing its last row")

    def _after_batch(self, loop: Any, every: int) -> None:
        try:
            step = int(loop._batches_that_stepped)  # the step of Lightning's own row for this batch
            self._last_step, self._epoch = step, int(loop.trainer.current_epoch)
            if (step + 1) % every == 0:  # as Lightning's should_update_logs decides
                self.write_row(step)
        except Exception as error:
            self._stop(error, "sampling")

    def write_row(self, step: int, *, memory_now: bool = False) -> None:
        """Write the means of the batches timed since the last row as the row of ``step``, with the memory now if it
        was last read :data:`MEMORY_EVERY_S` ago or more (``memory_now``: in any case)."""
        row: dict[str, float | int] = dict(self.timer.take())
        if row:
            row.update(self._memory.sample(now=memory_now))
            row["epoch"] = self._epoch  # as Lightning adds to its rows
            self._logger.log_telemetry(row, step)

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
