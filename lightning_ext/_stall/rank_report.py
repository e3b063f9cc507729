"""A rank in a stall report: its progress, its place in Lightning's terms, its stacks; whether a peer lives."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil

from lightning_ext._watch.rank_facts import Call, Facts

if TYPE_CHECKING:  # the recorder counts with torch.distributed; a report is plain data, and the rules read it pure
    from lightning_ext._watch.facts import Recorder

__all__ = ["Liveness", "RankReport", "checkpoint_work", "collect", "launched", "liveness", "progress_marks"]

_LOGGED_KEYS = 6  # the last logged keys a report shows
# seconds for an ended child's exit status (the thread reaping it holds the lock a moment; 2 s ran out on a loaded
# machine, and the report said "its process exited" where it could name the signal)
_REAP_WAIT = 10.0


@dataclass(frozen=True)
class RankReport:
    """One rank's part of a stall report (plain data: it travels through the store).

    Attributes:
        rank: the rank.
        state: ``"answered"``, ``"exited"`` (its process is gone) or ``"silent"`` (no answer in time).
        detail: for a rank that did not answer, what is known (``"killed by SIGKILL"``), else ``""``.
        pid: its process id (0 if unknown).
        host: its host name.
        facts: issue 19's facts (the collective call it is inside, its synced backward pass, its progress in the loops).
        hook: the Lightning hook it runs (``training_step``), or ``None``.
        waiting: what it waits in (``"collective"``, ``"check"``, ``"backward"``) and for how many seconds, or ``None``.
        since_progress: seconds since its progress counters last moved.
        busy: whether it is writing or loading a checkpoint.
        last_call: the last collective call it entered outside a backward pass (completed unless ``facts.inside``).
        logged: its last logged keys, as ``"key (hook)"``.
        workers: its DataLoader worker processes, as ``"pid 42: sleeping, 0.1 s CPU"``.
        stacks: every thread's Python stack, as ``(thread name, formatted stack)``; the training thread first.

    """

    rank: int
    state: str = "answered"
    detail: str = ""
    pid: int = 0
    host: str = ""
    facts: Facts | None = None
    hook: str | None = None
    waiting: tuple[str, float] | None = None
    since_progress: float | None = None
    busy: bool = False
    last_call: Call | None = None
    logged: tuple[str, ...] = ()
    workers: tuple[str, ...] = ()
    stacks: tuple[tuple[str, str], ...] = field(default=(), repr=False)


def progress_marks(recorder: Recorder) -> tuple[Any, ...]:
    """Every progress counter of this rank (when any of them moves, the rank made progress); no collective.

    The collective calls started, synced backward passes completed and checks passed, Lightning's batch counters of
    every loop, and the optimizer steps. Read by the monitor thread: a few attribute reads.
    """
    marks: list[Any] = [recorder.total(), recorder.backwards, recorder.checks]
    trainer = recorder.trainer
    with contextlib.suppress(AttributeError, TypeError):  # a trainer half set up: the counters come later
        fit = trainer.fit_loop.epoch_loop
        loops = (fit, fit.val_loop, trainer.validate_loop, trainer.test_loop, trainer.predict_loop)
        for loop in loops:
            total = loop.batch_progress.total
            marks.extend((total.ready, total.completed))
        marks.append(trainer.global_step)
    return tuple(marks)


def checkpoint_work(trainer: Any, recorder: Recorder | None) -> None:
    """Mark checkpoint work as progress however long it takes (``recorder``), or stop marking it (``None``).

    The work: building the checkpoint (``dump_checkpoint``: state dicts, ``on_save_checkpoint`` hooks), writing it and
    loading one (the strategy's ``save_checkpoint``, ``load_checkpoint``), not the barrier after a save. Instance
    attributes over the objects' own methods (whatever class implements them), removed at teardown.
    """
    with contextlib.suppress(AttributeError):  # a trainer half set up, or none (the launching process under spawn)
        owners = (trainer.strategy, trainer.strategy, trainer._checkpoint_connector)
        for owner, name in zip(owners, ("save_checkpoint", "load_checkpoint", "dump_checkpoint"), strict=True):
            vars(owner).pop(name, None)
            if recorder is not None:
                vars(owner)[name] = _busy(getattr(owner, name), recorder)


def _busy(method: Callable[..., Any], recorder: Recorder) -> Callable[..., Any]:
    def busy(*args: Any, **kwargs: Any) -> Any:
        with recorder.busy():
            return method(*args, **kwargs)

    return busy


def collect(recorder: Recorder, since_progress: float, host: str) -> RankReport:
    """This rank's report, made by its watchdog thread while the training thread is wherever it is."""
    trainer = recorder.trainer
    now = time.monotonic()
    wait = recorder.waiting()
    facts = recorder.snapshot()
    return RankReport(
        rank=recorder.rank,
        pid=os.getpid(),
        host=host,
        facts=facts,
        hook=_hook(trainer),
        waiting=None if wait is None else (wait[0], now - wait[1]),
        since_progress=since_progress,
        busy=recorder.is_busy(),
        last_call=facts.recent[-1] if facts.recent else None,
        logged=_logged(trainer),
        workers=_workers(),
        stacks=_stacks(recorder.thread),
    )


@dataclass(frozen=True)
class Liveness:
    """Whether a rank's process still exists, as far as this process can tell.

    Attributes:
        alive: ``False`` when the process is known to be gone; ``None`` when it cannot be told (another host).
        detail: how it ended (``"killed by SIGKILL"``, ``"exited with code 1"``) where known.

    """

    alive: bool | None
    detail: str = ""


def liveness(pid: int, host: str, my_host: str, children: dict[int, Any]) -> Liveness:
    """Whether process ``pid`` on ``host`` lives (``children``: this process's launched ranks' ``Popen`` by pid)."""
    if host != my_host or pid <= 0:
        return Liveness(None)
    child = children.get(pid)
    if child is not None:
        code = child.poll()  # None also while another thread (Lightning's child observer) is reaping it
        if code is None and not _process(pid).alive:
            with contextlib.suppress(subprocess.TimeoutExpired):  # it ended: its status, whichever thread reaps it
                code = child.wait(timeout=_REAP_WAIT)
        if code is not None:
            return Liveness(False, _ended(code))
    return _process(pid)


def _process(pid: int) -> Liveness:
    """Whether ``pid`` runs, from the process table alone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return Liveness(False, "its process no longer exists")
    except PermissionError:
        return Liveness(True)
    if _is_zombie(pid):  # ended, not yet reaped by its parent (a launcher's agent, spawn's parent)
        return Liveness(False, "its process exited")
    return Liveness(True)


def _is_zombie(pid: int) -> bool:
    """Whether ``pid`` has exited but not been reaped."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:  # gone meanwhile, or not ours to look at
        return False


def launched(trainer: Any) -> dict[int, Any]:
    """The ranks this process launched, by pid (Lightning's default launcher: rank 0 is their parent), else ``{}``."""
    with contextlib.suppress(AttributeError, TypeError):  # another launcher (no procs), or none
        return {proc.pid: proc for proc in trainer.strategy.launcher.procs}
    return {}


def _ended(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with code {code}"


def _hook(trainer: Any) -> str | None:
    with contextlib.suppress(AttributeError):  # no trainer or module yet
        name = trainer.lightning_module._current_fx_name
        return None if name is None else str(name)
    return None


def _logged(trainer: Any) -> tuple[str, ...]:
    """The last keys logged in the running loop (``trainer._results``), newest last."""
    # the training thread may be changing the collection (RuntimeError); a trainer without one: skip, it is a report
    with contextlib.suppress(RuntimeError, AttributeError):
        results = trainer._results
        if results is None:
            return ()
        entries = [f"{metric.meta.name} ({metric.meta.fx})" for metric in list(results.values())[-_LOGGED_KEYS:]]
        return tuple(entries)
    return ()


def _workers() -> tuple[str, ...]:
    """This process's DataLoader workers (its multiprocessing children), with their state while they exist."""
    described = []
    try:
        children = multiprocessing.active_children()
    except (RuntimeError, OSError):  # the set of workers changes meanwhile: a report goes without them
        children = []
    for child in children:
        text = f"pid {child.pid} ({child.name})"
        with contextlib.suppress(psutil.Error):  # a worker that ended meanwhile: its pid and name only
            process = psutil.Process(child.pid)
            times = process.cpu_times()
            text += f": {process.status()}, {times.user + times.system:.1f} s CPU"
        described.append(text)
    return tuple(described)


def _stacks(training_thread: int) -> tuple[tuple[str, str], ...]:
    """Every thread's stack; the training thread first."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = sys._current_frames()
    order = sorted(frames, key=lambda ident: (ident != training_thread, names.get(ident, "")))
    stacks = []
    for ident in order:
        if names.get(ident, "").startswith("lightning-ext-"):  # this report's own threads: always the same
            continue
        label = names.get(ident, f"thread {ident}") + (" (training thread)" if ident == training_thread else "")
        stacks.append((label, "".join(traceback.format_stack(frames[ident]))))
    return tuple(stacks)
