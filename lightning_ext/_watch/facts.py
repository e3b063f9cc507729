"""How a rank records its facts: torch.distributed's collectives counted by wrappers, backward passes, signals."""

from __future__ import annotations

import contextlib
import functools
import inspect
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch.distributed as dist

from lightning_ext._torch_collectives import COLLECTIVES
from lightning_ext._watch.progress import progress_of
from lightning_ext._watch.rank_facts import WORLD, Call, Facts
from lightning_ext._watch.sites import called_as, user_site

__all__ = ["Recorder", "SignalConsumer", "barrier_skipped_now", "make_call"]

SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")


class Recorder:
    """The facts of this rank, kept up to date by its training thread and read by its watchdog.

    Args:
        rank: this rank.
        world_size: the number of ranks.
        trainer: the trainer (for its progress), or ``None``.

    """

    def __init__(self, rank: int, world_size: int, trainer: Any) -> None:
        self.rank, self.world_size, self.trainer = rank, world_size, trainer
        self.thread = threading.get_ident()  # the training thread: only its calls are counted
        self.check: tuple[int, str] | None = None
        self.checks = 0  # the last check passed (set before ``check`` is cleared)
        self.counts: dict[str, int] = {}
        self.backwards = 0
        self.batches = 0  # batches started, every stage (counted by the logging checks' seam)
        self.signal: str | None = None
        self.recent: deque[Call] = deque(maxlen=8)
        self._inside: tuple[str, int, str, FrameType, Call | None, float] | None = None
        self._backward: int | None = None
        self._backward_since = 0.0
        self.forwards = 0
        self._forward: tuple[int, tuple[str, ...], float] | None = None  # (number, what it broadcasts, since when)
        self.check_since = 0.0  # when the training thread entered the check it is in (``check``)
        self._busy = 0  # checkpoint writes and loads under way
        self._groups: dict[int, tuple[Any, str]] = {}
        self._depth = 0
        self.checked = False  # the training thread is in a call that a check has just lined up: not the odd one
        self.lined_up = False  # the training thread's barrier calls do nothing now (see ``barrier_skipped``)
        self._originals: dict[str, Callable[..., Any]] = {}
        self._signal_handlers: dict[int, _SignalNote] = {}
        # set by the owner: what a signal means for the run; it may return what runs instead of the replaced handler
        self.on_signal: Callable[[str, str], SignalConsumer | None] = _ignore

    def total(self) -> int:
        """Every counted collective call so far (part of each check's fingerprint: the ranks must agree on it)."""
        return sum(self.counts.values())

    def install(self) -> None:
        """Count the training thread's ``torch.distributed`` collective calls from now on."""
        global _ACTIVE
        _ACTIVE = self
        for name in COLLECTIVES:  # point-to-point calls are not counted: they are not symmetric
            function = getattr(dist, name, None)
            if function is not None and not getattr(function, _MARK, False):
                self._originals[name] = function
                setattr(dist, name, _counted(function, name))

    def uninstall(self) -> None:
        """Stop counting, and give back the signal handlers this recorder wrapped."""
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        for name, function in self._originals.items():
            if getattr(getattr(dist, name, None), _MARK, False):
                setattr(dist, name, function)
        self._originals.clear()
        self._groups.clear()
        if threading.current_thread() is threading.main_thread():
            for number, note in self._signal_handlers.items():
                previous = note.previous
                if signal.getsignal(number) is note:
                    signal.signal(number, previous)
        self._signal_handlers.clear()

    def watch_signals(self) -> None:
        """Note SIGTERM, SIGINT and SIGUSR1 when they arrive, before the handlers already installed run (idempotent).

        Called once Lightning has installed its own handlers (its SIGTERM handler makes a collective call on the
        signalled rank alone), so the note comes first.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for name in SIGNALS:
            number = getattr(signal, name, None)
            if number is None:
                continue
            current = signal.getsignal(number)
            if isinstance(current, _SignalNote) and current.recorder is self:
                continue
            wrapper = _SignalNote(self, name, current)
            with contextlib.suppress(ValueError, OSError):
                signal.signal(number, wrapper)
                self._signal_handlers[number] = wrapper

    @contextlib.contextmanager
    def backward_pass(self, synced: bool | None) -> Iterator[None]:
        """Within the block, this rank is in a backward pass (``synced``: DDP all-reduces its gradients in it)."""
        if not synced:
            yield
            return
        self._backward = self.backwards + 1
        self._backward_since = time.monotonic()
        try:
            yield
        finally:
            self._backward = None
        self.backwards += 1

    @contextlib.contextmanager
    def forward_pass(self, syncs: tuple[str, ...]) -> Iterator[None]:
        """Within the block, this rank is in a DDP forward pass that broadcasts ``syncs`` (``"buckets"``,
        ``"buffers"``) before the module runs; ``()``: one that makes no collective call (not counted)."""
        if not syncs:
            yield
            return
        self._forward = (self.forwards + 1, syncs, time.monotonic())
        try:
            yield
        finally:
            self._forward = None
        self.forwards += 1

    @contextlib.contextmanager
    def barrier_skipped(self, checked: bool) -> Iterator[None]:
        """Within the block, the training thread's ``torch.distributed.barrier`` calls return at once, uncounted.

        The ranks are lined up already (a check, or the coalesced sync's pack on every rank at the same hook end), so
        the barrier Lightning's ``_sync_ddp`` runs before its all-reduce would only add a collective. The counting
        wrapper skips it for the training thread only: another thread's barrier runs. ``checked``: a check lined the
        ranks up, so the calls inside are not the odd ones out.
        """
        self.lined_up, self.checked = True, checked
        try:
            yield
        finally:
            self.lined_up = self.checked = False

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Within the block, this rank writes or loads a checkpoint: work that is progress however long it takes."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1

    def is_busy(self) -> bool:
        """Whether a checkpoint write or load is under way (read by the stall monitor)."""
        return self._busy > 0

    def waiting(self) -> tuple[str, float] | None:
        """What the training thread waits in now, and since when (``time.monotonic()``), or ``None``.

        ``("collective", t)``: inside a counted collective call; ``("check", t)``: inside a lightning-ext check;
        ``("backward", t)``: inside a backward pass whose gradients DDP all-reduces, ``("forward", t)``: inside a DDP
        forward pass that broadcasts (each a wait only while another rank has not started that pass, which only the
        other ranks' facts can tell).
        """
        inside = self._inside
        if inside is not None:
            return ("collective", inside[5])
        if self.check is not None:
            return ("check", self.check_since)
        if self._backward is not None:
            return ("backward", self._backward_since)
        forward = self._forward
        if forward is not None:
            return ("forward", forward[2])
        return None

    def snapshot(self) -> Facts:
        """This rank's facts now (called by the watchdog thread, or by the training thread on an error path)."""
        inside = self._inside
        call = None
        if inside is not None:
            group, index, name, caller, call, _ = inside
            call = call or make_call(group, index, name, caller)
        frame = sys._current_frames().get(self.thread)
        forward = self._forward
        return Facts(
            rank=self.rank,
            check=self.check,
            checks=self.checks,
            counts=dict(self.counts),
            inside=call,
            backward=self._backward,
            backwards=self.backwards,
            forward=None if forward is None else forward[0],
            forwards=self.forwards,
            forward_syncs=() if forward is None else forward[1],
            progress=progress_of(self.trainer),
            signal=self.signal,
            recent=tuple(self.recent),
            at=None if frame is None else user_site(frame, default=None),
            batches=self.batches,
        )

    def _group_key(self, group: Any) -> str | None:
        """``"world"``, the name of another group of every rank, or ``None`` for a group of some ranks only."""
        if group is None or group is dist.group.WORLD:
            return WORLD
        known = self._groups.get(id(group))
        if known is not None and known[0] is group:
            return known[1]
        try:
            spans = dist.get_world_size(group) == self.world_size
            key = str(getattr(group, "group_name", id(group))) if spans else None
        except Exception:  # guards the user's own collective call, which this wrapper is about to make. Nothing
            # narrower: whatever torch says of a group object it does not know (or that this rank is not in), the call
            # itself must go on and report it; the group is then not counted
            key = None
        if key is not None:
            self._groups[id(group)] = (group, key)
        return key


# what runs in place of a replaced signal handler once the owner has taken the signal: (replaced, number, frame)
SignalConsumer = Callable[[Any, int, FrameType | None], Any]


class _SignalNote:
    """A signal handler that notes the signal, calls the recorder's ``on_signal``, then runs the handler it replaced
    (or, once ``on_signal`` has returned a consumer, that consumer, for this signal and its repeats)."""

    def __init__(self, recorder: Recorder, name: str, previous: Any) -> None:
        self.recorder, self.name, self.previous = recorder, name, previous
        self.consumer: SignalConsumer | None = None

    @property
    def signal_handlers(self) -> list[Any]:
        """The handler it runs after its note, as a compose holds its handlers (a later run's stop walks into it)."""
        return [self.previous]

    def __call__(self, number: int, frame: FrameType | None) -> Any:
        recorder = self.recorder
        if recorder.signal is None:
            progress = progress_of(recorder.trainer)
            recorder.signal = self.name + (f" in {progress.describe()}" if progress is not None else "")
            self.consumer = recorder.on_signal(self.name, recorder.signal)  # may raise instead
        if self.consumer is not None:
            return self.consumer(self.previous, number, frame)
        previous = self.previous
        if callable(previous):
            return previous(number, frame)
        if previous == signal.SIG_DFL:  # the default action: end the process as the signal would have
            signal.signal(number, signal.SIG_DFL)
            signal.raise_signal(number)
        return None


def _ignore(name: str, text: str) -> SignalConsumer | None:
    return None


_ACTIVE: Recorder | None = None
_MARK = "__lightning_ext_counted__"


def _counted(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    try:
        position = list(inspect.signature(function).parameters).index("group")
    except (ValueError, TypeError):
        position = -1

    skippable = name == "barrier"

    @functools.wraps(function)
    def counted(*args: Any, **kwargs: Any) -> Any:
        recorder = _ACTIVE
        if recorder is None or recorder._depth or threading.get_ident() != recorder.thread:
            return function(*args, **kwargs)
        if skippable and recorder.lined_up:  # Lightning's barrier before an all-reduce of ranks already lined up
            return None
        group = kwargs.get("group", args[position] if 0 <= position < len(args) else None)
        key = recorder._group_key(group)
        if key is None:
            return function(*args, **kwargs)
        index = recorder.counts[key] = recorder.counts.get(key, 0) + 1
        caller = sys._getframe(1)
        call = None
        if recorder._backward is None and not recorder.checked:  # where a call may be the odd one out: name it now
            call = make_call(key, index, name, caller)
            recorder.recent.append(call)
        recorder._depth += 1
        recorder._inside = (key, index, name, caller, call, time.monotonic())
        try:
            return function(*args, **kwargs)
        finally:
            recorder._inside = None
            recorder._depth -= 1

    setattr(counted, _MARK, True)
    return counted


def barrier_skipped_now() -> bool:
    """Whether a ``torch.distributed.barrier`` that this thread calls now returns at once (``barrier_skipped``)."""
    recorder = _ACTIVE
    return bool(recorder is not None and recorder.lined_up and threading.get_ident() == recorder.thread)


def make_call(group: str, index: int, name: str, caller: FrameType) -> Call:
    """The :class:`Call` for ``torch.distributed.<name>``, called from ``caller``."""
    via, site, lightning = called_as(caller)
    return Call(group, index, f"torch.distributed.{name}" + (f" (via {via})" if via else ""), site, lightning)
