"""A persistent pool of rank processes: one real gloo process group that serves many test calls.

``RankPool(world_size).run("tests.helpers.decision_tasks:fn", args_for_rank_0, args_for_rank_1, ...)`` runs ``fn`` on
every rank at once and returns the results in rank order. Starting processes and a process group costs seconds; a call
costs milliseconds, so property tests can drive hundreds of examples through the real collective path.

Like PyTorch's ``MultiProcessTestCase``, a failure in any rank is re-raised in the parent with that rank's full
traceback, and every call has a deadline: a rank that does not answer in time (a hang) gets the whole pool killed
and a ``RankTimeout`` naming the silent ranks. A broken pool is replaced on the next call.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = ["RankFailure", "RankPool", "RankTimeout", "tasks_renamed"]

_START_TIMEOUT = 120.0
_GRACE_AFTER_FAILURE = 5.0
# Ranks start from a fork server that has imported torch (and the torch._dynamo that Lightning imports): seconds of
# CPU per rank saved, and their pages shared. Neither Lightning package is preloaded: which one a rank imports first is
# part of what some tasks test. Each rank is still a process of its own, in a gloo group of its own.
_CONTEXT = mp.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo"])


class RankFailure(AssertionError):
    """One or more ranks raised; the message holds each failing rank's traceback."""

    def __init__(self, message: str, failures: dict[int, _Outcome]) -> None:
        super().__init__(message)
        self.failures = failures

    def messages(self) -> dict[int, str]:
        """The last line of each failing rank's traceback (``Type: message``)."""
        return {rank: outcome.summary for rank, outcome in self.failures.items()}


class RankTimeout(AssertionError):
    """Some ranks did not answer before the deadline (the pool was killed)."""


@dataclass
class _Outcome:
    rank: int
    ok: bool
    value: Any = None
    traceback: str = ""
    summary: str = ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _worker(rank: int, world_size: int, port: int, tasks: Any, results: Any, env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=90))
        results.put((None, _Outcome(rank, True, "ready")))
    except BaseException as exc:  # report, then exit
        results.put((None, _Outcome(rank, False, None, traceback.format_exc(), f"{type(exc).__name__}: {exc}")))
        return
    while True:
        message = tasks.get()
        if message is None:
            break
        call_id, target, args, kwargs = message
        try:
            module_name, function_name = target.split(":")
            function = getattr(importlib.import_module(module_name), function_name)
            outcome = _Outcome(rank, True, function(*args, **kwargs))
        except BaseException as exc:
            outcome = _Outcome(rank, False, None, traceback.format_exc(), f"{type(exc).__name__}: {exc}")
        try:
            results.put((call_id, outcome))
        except Exception as exc:  # an unpicklable result
            results.put((call_id, _Outcome(rank, False, None, traceback.format_exc(), f"unpicklable result: {exc}")))
    dist.destroy_process_group()


_TASK_RENAMES: list[Callable[[str], str]] = []


@contextlib.contextmanager
def tasks_renamed(rename: Callable[[str], str]) -> Iterator[None]:
    """Within the block, every pool runs a task ``module:function`` as ``rename(module):function``."""
    _TASK_RENAMES.append(rename)
    try:
        yield
    finally:
        _TASK_RENAMES.pop()


class RankPool:
    """``world_size`` processes, each one rank of a gloo process group on localhost, reused across calls.

    Args:
        world_size: the number of ranks.
        env: extra environment variables for the ranks.

    """

    def __init__(self, world_size: int, env: dict[str, str] | None = None) -> None:
        self.world_size = world_size
        self._env = dict(env or {})
        self._context = _CONTEXT
        self._processes: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None
        self._calls = 0
        self.starts = 0

    def run(self, target: str, *per_rank_args: tuple[Any, ...], timeout: float = 60.0, **kwargs: Any) -> list[Any]:
        """Run ``module:function`` on every rank and return the results in rank order.

        Args:
            target: ``"package.module:function"``, importable in the rank processes.
            per_rank_args: one tuple of positional arguments per rank; a single tuple is given to every rank.
            timeout: seconds for every rank to answer.
            kwargs: keyword arguments for every rank.

        Raises:
            RankFailure: a rank raised; the message has its traceback.
            RankTimeout: a rank did not answer in time (the pool is killed and restarted on the next call).

        """
        if _TASK_RENAMES:  # the pytorch_lightning copy of a suite: its tasks as compiled for pytorch_lightning
            module, _, function = target.partition(":")
            target = f"{_TASK_RENAMES[-1](module)}:{function}"
        if len(per_rank_args) <= 1:
            per_rank_args = (per_rank_args[0] if per_rank_args else (),) * self.world_size
        if len(per_rank_args) != self.world_size:
            raise ValueError(f"Expected 1 or {self.world_size} argument tuples, got {len(per_rank_args)}")
        self._ensure_started()
        self._calls += 1
        call_id = self._calls
        for rank in range(self.world_size):
            self._tasks[rank].put((call_id, target, per_rank_args[rank], kwargs))
        outcomes = self._collect(call_id, timeout, what=f"{target} (call {call_id})")
        failures = {rank: outcome for rank, outcome in outcomes.items() if not outcome.ok}
        if failures:
            raise RankFailure(self._describe_failures(target, failures), failures)
        return [outcomes[rank].value for rank in range(self.world_size)]

    @property
    def running(self) -> bool:
        """Whether the ranks are up (a call would not start them)."""
        return bool(self._processes) and all(process.is_alive() for process in self._processes)

    def close(self) -> None:
        """Stop the ranks (politely, then by force)."""
        for tasks in self._tasks:
            with contextlib.suppress(Exception):
                tasks.put(None)
        deadline = time.monotonic() + 5
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
        self._kill()

    def _ensure_started(self) -> None:
        if self.running:
            return
        self._kill()
        self.starts += 1
        port = _free_port()
        self._results = self._context.Queue()
        self._tasks = [self._context.Queue() for _ in range(self.world_size)]
        self._processes = [
            self._context.Process(
                target=_worker,
                args=(rank, self.world_size, port, self._tasks[rank], self._results, self._env),
                daemon=True,
                name=f"rank-{rank}",
            )
            for rank in range(self.world_size)
        ]
        for process in self._processes:
            process.start()
        outcomes = self._collect(None, _START_TIMEOUT, what="process group start")
        failures = {rank: outcome for rank, outcome in outcomes.items() if not outcome.ok}
        if failures:
            self._kill()
            raise RankFailure(self._describe_failures("process group start", failures), failures)

    def _collect(self, call_id: int | None, timeout: float, what: str) -> dict[int, _Outcome]:
        outcomes: dict[int, _Outcome] = {}
        deadline = time.monotonic() + timeout
        while len(outcomes) < self.world_size:
            if any(not outcome.ok for outcome in outcomes.values()):
                # a rank failed: the others may be stuck in a collective; give them a moment, not the full deadline
                deadline = min(deadline, time.monotonic() + _GRACE_AFTER_FAILURE)
            remaining = deadline - time.monotonic()
            dead = [p.name for p in self._processes if not p.is_alive() and int(p.name.split("-")[1]) not in outcomes]
            if remaining <= 0 or dead:
                silent = sorted(set(range(self.world_size)) - set(outcomes))
                failures = {rank: outcome for rank, outcome in outcomes.items() if not outcome.ok}
                self._kill()
                if failures:
                    raise RankFailure(
                        self._describe_failures(what, failures) + f"\n(ranks {silent} never answered; pool killed)",
                        failures,
                    )
                reason = f"died ({', '.join(dead)})" if dead else f"did not answer within {timeout:.0f}s"
                raise RankTimeout(f"{what}: rank(s) {silent} {reason}; the pool was killed")
            try:
                got_id, outcome = self._results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if got_id == call_id:
                outcomes[outcome.rank] = outcome
        return outcomes

    def _describe_failures(self, what: str, failures: dict[int, _Outcome]) -> str:
        parts = [f"{what} failed on rank(s) {sorted(failures)} of {self.world_size}:"]
        for rank in sorted(failures):
            parts.append(f"--- rank {rank} traceback ---\n{failures[rank].traceback.rstrip()}")
        return "\n".join(parts)

    def _kill(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.kill()
        for process in self._processes:
            process.join(5)
        self._processes = []
        self._tasks = []
