"""Each training batch timed by phase: the timer, the blocks it times, and the wait at the end of a backward pass."""

from collections.abc import Callable
from time import perf_counter_ns
from types import TracebackType
from typing import Any, TypeVar

from torch.autograd import Variable

from lightning_ext._files.csv_format import (
    BACKWARD_S,
    COLLECTIVES_S,
    DATA_WAIT_S,
    FORWARD_S,
    GRADIENT_WAIT_S,
    OPTIMIZER_S,
    STEP_S,
)
from lightning_ext._files.storage import guarded

__all__ = [
    "BACKWARD",
    "COLLECTIVES",
    "DATA_WAIT",
    "FORWARD",
    "GRADIENT_WAIT",
    "OPTIMIZER",
    "GradientWait",
    "StepTimer",
    "timed",
    "timed_backward",
    "timing",
]

DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVES, GRADIENT_WAIT = range(6)
_PHASES = (DATA_WAIT_S, FORWARD_S, BACKWARD_S, OPTIMIZER_S, COLLECTIVES_S, GRADIENT_WAIT_S)
_Result = TypeVar("_Result")


class StepTimer:
    """Each training batch's time and its phases' own times, summed until :meth:`take` makes them a row.

    A phase's own time leaves out what ran nested in it (the closure inside ``optimizer_step``, a synced value's
    collective inside ``training_step``, the gradient all-reduce's wait inside ``backward``), so the phases add up to
    at most the step. Outside a batch nothing is timed: :meth:`begin` says whether it started a phase.
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

    def add(self, phase: int, took: int) -> None:
        """``took`` nanoseconds of ``phase`` that ended just now, nested in the phase under way (if any)."""
        if len(self._stack) >= 2:
            self._totals[phase] += took
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


class GradientWait:
    """The time a backward pass spends after its own computation, blocked in what autograd runs last.

    DDP's reducer queues ``finalize_backward`` as one of autograd's final callbacks once every gradient bucket is
    ready; there it waits for the all-reduce of the last buckets, that is for the slowest rank's gradients. Autograd
    runs the final callbacks in the order they were queued, after the graph, and runs those queued meanwhile after
    them. So :meth:`arm` queues a first callback as the graph starts (from a hook on the loss's node, before any
    gradient, hence before DDP's), which notes the time the computation ended and queues a second one, which runs after
    DDP's: the time between the two is the wait, counted in the timer's ``GRADIENT_WAIT`` (nested in ``backward``).
    Without DDP (a step that only accumulates gradients, another strategy) nothing is queued in between: about 0.
    """

    __slots__ = ("_computed", "_timer")

    def __init__(self, timer: StepTimer) -> None:
        self._timer = timer
        self._computed = 0

    def arm(self, loss: Any) -> Any:
        """Measure the backward pass about to run from ``loss``; returns a handle to remove after it (or ``None``)."""
        node = getattr(loss, "grad_fn", None)
        return None if node is None else node.register_prehook(self._started)

    def _started(self, _grad_outputs: Any) -> None:
        Variable._execution_engine.queue_callback(self._computation_ended)

    def _computation_ended(self) -> None:
        self._computed = perf_counter_ns()
        Variable._execution_engine.queue_callback(self._waited)

    def _waited(self) -> None:
        self._timer.add(GRADIENT_WAIT, perf_counter_ns() - self._computed)


def timed_backward(wait: GradientWait | None, call: Callable[..., _Result], *args: Any, **kwargs: Any) -> _Result:
    """``call(*args, **kwargs)``, the strategy's ``backward`` of the loss ``args[0]``, timed in ``BACKWARD`` with its
    gradient all-reduce's wait measured by ``wait``, while a batch is being timed."""
    timer = None if wait is None else wait._timer
    if timer is None or wait is None or not timer.begin():
        return call(*args, **kwargs)
    handle = None
    try:
        with guarded():  # a diagnostic: the backward pass runs whatever happens here
            handle = wait.arm(args[0] if args else kwargs.get("closure_loss"))
        return call(*args, **kwargs)
    finally:
        if handle is not None:
            handle.remove()
        timer.end(BACKWARD)
