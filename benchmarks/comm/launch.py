"""Launching one session's ranks from the parent: spawn, watch, time out, and bring rank 0's result back.

The ranks are started with ``torch.multiprocessing.start_processes(..., start_method="spawn")``. The parent polls
their result queue (progress messages and rank 0's result) and joins them. A rank that raises has its traceback
re-raised here as :class:`SessionFailed` (torch writes it to an error file that the join reads back), and the others
are stopped. A session that runs past its deadline is killed and raises :class:`SessionTimeout`. Inside the ranks,
every collective also has a deadline (:data:`benchmarks.comm.session.COLLECTIVE_TIMEOUT_S`).
"""

import multiprocessing as mp
import queue
import socket
import time
from collections.abc import Callable
from typing import Any

from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException, start_processes

from benchmarks.comm.plan import Counts, SessionSpec
from benchmarks.comm.session import SessionResult, rank_main

__all__ = ["SessionFailed", "SessionTimeout", "run_session"]

_POLL_S = 0.2
_GRACE_S = 5.0


class SessionFailed(RuntimeError):
    """A rank of a session failed; the message holds its traceback."""


class SessionTimeout(SessionFailed):
    """A session ran past its deadline; its ranks were killed."""


def run_session(
    spec: SessionSpec,
    counts: Counts,
    *,
    workdir: str,
    timeout_s: float,
    on_progress: Callable[[int], None],
) -> SessionResult:
    """Run ``spec`` on ``spec.world_size`` spawned ranks and return rank 0's result.

    Args:
        spec: the session.
        counts: how much to measure.
        workdir: a directory the ranks share.
        timeout_s: the deadline for the whole session, start-up included.
        on_progress: called in the parent with each progress report (units of work done).

    Raises:
        SessionFailed: a rank raised (with its traceback) or died, or rank 0 sent no result.
        SessionTimeout: the session did not finish within ``timeout_s``.

    """
    results: Any = mp.get_context("spawn").Queue()
    start: Callable[..., Any] = start_processes  # untyped in torch
    context = start(
        rank_main,
        args=(spec, counts, workdir, _free_port(), results),
        nprocs=spec.world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    found: list[SessionResult] = []
    try:
        while True:
            _drain(results, on_progress, found)
            if context.join(timeout=_POLL_S, grace_period=_GRACE_S):
                break
            if time.monotonic() > deadline:
                raise SessionTimeout(f"{spec.label}: no result within {timeout_s:.0f} s; the ranks were killed")
        _drain(results, on_progress, found)
    except ProcessRaisedException as exc:
        raise SessionFailed(f"{spec.label}: rank {exc.error_index} failed:{exc.msg}") from None
    except ProcessExitedException as exc:
        raise SessionFailed(f"{spec.label}: rank {exc.error_index} died: {exc.msg}") from None
    finally:
        _stop(context.processes)
        results.close()
    if not found:
        raise SessionFailed(f"{spec.label}: the ranks exited without rank 0 sending a result")
    return found[-1]


def _drain(results: Any, on_progress: Callable[[int], None], found: list[SessionResult]) -> None:
    while True:
        try:
            kind, payload = results.get_nowait()
        except queue.Empty:
            return
        if kind == "progress":
            on_progress(payload)
        elif kind == "result":
            found.append(payload)


def _stop(processes: list[Any]) -> None:
    """Stop this session's ranks that are still alive (only ours, by handle): politely, then by force."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(_GRACE_S)
        if process.is_alive():
            process.kill()
            process.join(_GRACE_S)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
