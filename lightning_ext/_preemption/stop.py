"""The coordinated stop on preemption: a signal on any rank stops every rank at the same point of a fit (a training
step's start, or an evaluation batch's end)."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_ext._collective import STORE_ERRORS
from lightning_ext._preemption import checkpoint as stop_checkpoint
from lightning_ext._rank_lists import ranks_text
from lightning_ext._watch.facts import SignalConsumer
from lightning_ext._watch.watchdog import Watchdog, raise_record
from lightning_ext.errors import mark_joint
from lightning_ext.policies import PolicyLike, VotePolicy, VoteTally, resolve_policy

__all__ = ["StopController", "resolve_preemption_policy"]

_MAIL = "preempt"  # the watchdog mail a signalled rank sends rank 0
_POSITION = "stop-position"  # rank 0's request: the first stop point each rank can still stop at
_AGREED = "stop-at"  # rank 0's notice to every rank: the point to stop at (-1: no stop after all)
_SEAM = "_broadcast_sigterm_tensor"  # Lightning's per-step broadcast of rank 0's SIGTERM flag: replaced in a fit
_HOLD_LOOK = 0.05  # seconds between two looks for a posted error while a rank holds for the agreement
_PARENT_WAIT = 10.0  # seconds a popen child waits at exit for rank 0 (its parent) to exit first
# Lightning's own handlers that the stop replaces: the SIGTERM one broadcasts on the signalled rank alone, the SLURM
# one saves a checkpoint (a collective) wherever the signal lands; the stop runs the latter at the agreed step
_REPLACED = ("_sigterm_notifier_fn", "_slurm_sigusr_handler_fn")


def resolve_preemption_policy(policy: PolicyLike | None) -> VotePolicy | None:
    """The vote policy that decides a coordinated stop, or ``None`` (off).

    Args:
        policy: ``"any"``, ``"all"``, ``"majority"``, ``"rank_zero"``, a :class:`~lightning_ext.policies.VotePolicy`
            such as ``Quorum(2)``, or ``None``.

    Raises:
        ValueError: an aggregate policy (``"mean"``, ``"min"``, ``"max"``): there is no value to reduce, each rank
            only says whether it was signalled; or an unknown name.
        TypeError: neither a name, a policy nor ``None``.

    Example:
        >>> resolve_preemption_policy("all")
        AllRanks()
        >>> resolve_preemption_policy(None) is None
        True
        >>> resolve_preemption_policy("mean")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: preemption_policy='mean' is an aggregate policy; ...

    """
    if policy is None:
        return None
    resolved = resolve_policy(policy)
    if not isinstance(resolved, VotePolicy):
        raise ValueError(
            f"preemption_policy={policy!r} is an aggregate policy; a stop is decided by a vote of the signalled ranks:"
            " use 'any' (the default), 'all', 'majority', 'rank_zero', a VotePolicy such as Quorum(k), or None (off)"
        )
    return resolved


class StopController:
    """One rank's part in a coordinated stop during a fit.

    Every rank passes the same *stop points* in the same order: the start of each training batch (where Lightning
    would broadcast rank 0's SIGTERM flag, ``_broadcast_sigterm_tensor``, shadowed on the epoch loop for the fit) and
    the end of each evaluation batch of the fit (the sanity check's included). A signalled rank mails rank 0's
    watchdog, and rank 0 decides under the policy. Then rank 0's watchdog agrees the point with every rank's
    watchdog: each says the next point its rank can still stop at, and from then on holds its rank there until told;
    rank 0 picks the latest and tells every rank. At each point a rank looks at what its own watchdog was told, under a
    lock: no collective and no host-device synchronization per batch. Every rank stops at the agreed point, or the
    first later one where no gradient accumulation window is open, as each rank derives alike.

    Args:
        policy: the vote policy that decides from the ranks signalled so far.
        watchdog: this rank's watchdog (its mail reaches rank 0; its recorder has the trainer).
        flush: writes this rank's buffered per-rank rows.

    """

    def __init__(self, policy: VotePolicy, watchdog: Watchdog, flush: Callable[[], None]) -> None:
        self.policy, self.watchdog, self._flush = policy, watchdog, flush
        self.rank, self.world_size = watchdog.rank, watchdog.world_size
        self.trainer = watchdog.recorder.trainer
        self.decided = False  # rank 0: a stop was decided (and is being, or was, agreed)
        self._signalled: dict[int, int] = {}  # rank 0's watchdog thread: each signalled rank's signal number
        self._reason = ""  # rank 0: why, for the stop message
        self._loop: Any = None
        # shared by the training thread (at each batch start) and the watchdog thread (agreeing a stop)
        self._lock = threading.Lock()
        self._next = 0  # the next stop point this rank passes (they are counted from the attach on, alike everywhere)
        self._holding = False  # a stop is being agreed: the training thread waits at its next point
        self._before: int | None = None  # the agreed point: stop there (or at the first later one outside a window)
        self._number = 0  # the agreed stop's signal
        self._agreed = threading.Event()
        watchdog.answers[_POSITION] = self._position
        watchdog.handlers[_AGREED] = self._on_agreed
        if self.rank == 0:
            watchdog.handlers[_MAIL] = self._decide

    def attach(self) -> None:
        """Take over Lightning's per-step broadcast for this fit (idempotent; nothing for other stages)."""
        trainer = self.trainer
        if self._loop is not None or trainer is None or trainer.state.fn != TrainerFn.FITTING:
            return
        loop = trainer.fit_loop.epoch_loop
        if not callable(getattr(type(loop), _SEAM, None)):
            warnings.warn(
                f"lightning-ext: this Lightning has no {type(loop).__name__}.{_SEAM}; a SIGTERM on one rank ends every"
                " rank with RankSignalledError, without a checkpoint (the coordinated stop needs that seam)",
                UserWarning,
                stacklevel=1,
            )
            return
        loop.__dict__[_SEAM] = self._at_batch_start
        self._loop = loop
        if self.rank == 0:  # the other ranks read it at a stop (popen: whether rank 0 is their parent)
            self.watchdog.store.set("stop/parent", str(os.getpid()))  # type: ignore[attr-defined]

    def detach(self) -> None:
        """Give Lightning its broadcast back, and stop serving stop requests (teardown)."""
        loop, self._loop = self._loop, None
        if loop is not None and loop.__dict__.get(_SEAM) == self._at_batch_start:
            del loop.__dict__[_SEAM]
        self.watchdog.handlers.pop(_MAIL, None)
        self.watchdog.handlers.pop(_AGREED, None)
        self.watchdog.answers.pop(_POSITION, None)
        self._agreed.set()  # nothing waits for an agreement any more

    def on_signal(self, name: str) -> SignalConsumer | None:
        """Ask rank 0 for a stop (in the signal handler); return what runs instead of Lightning's handler.

        ``None`` when this signal does not request a stop here (not fitting, not a preemption signal, or rank 0 cannot
        be reached): the caller then ends the run as before.
        """
        number = _stop_signal(name, self.trainer)
        if self._loop is None or number is None:
            return None
        try:
            self.watchdog.notify(0, _MAIL, sender=str(self.rank), signal=str(number))
        except STORE_ERRORS:  # the store is gone (rank 0's process ended): nothing to coordinate with
            return None
        self.watchdog.recorder.signal = None  # a stop request: no later error on this rank may name it as the cause
        return _other_handlers

    def _decide(self, message: dict[str, str]) -> None:
        """Rank 0's watchdog thread: tally the signalled ranks, decide under the policy (once), and agree the batch.

        No store round trip until a stop is decided: under load, each one waits for the training thread's GIL.
        """
        self._signalled.setdefault(int(message["sender"]), int(message["signal"]))
        if self.decided:
            return
        signalled = self._signalled
        tally = VoteTally(yes=len(signalled), world_size=self.world_size, rank_zero=0 in signalled)
        who = ", ".join(f"rank {rank} received {signal.Signals(signalled[rank]).name}" for rank in sorted(signalled))
        counted = f"preemption_policy {self.policy!r}: {tally.yes} of {tally.world_size} ranks signalled"
        try:
            stop = self.policy.decide(tally)
        except Exception as error:  # guards a user's policy (VotePolicy.decide: any code). Nothing narrower: whatever
            # it raises, the watchdog thread goes on, and training with it, with a warning naming the error
            warnings.warn(f"lightning-ext: {counted}: the policy raised {error!r}; training goes on", stacklevel=1)
            return
        if not stop:
            warnings.warn(f"lightning-ext: {who}; {counted}, not enough to stop: training goes on", stacklevel=1)
            return
        self.decided = True
        self._reason = f"{who} ({counted})"
        positions = self.watchdog.ask_others(_POSITION)
        positions[self.rank] = self._position()
        silent = sorted(set(range(self.world_size)) - set(positions))
        if silent:  # a rank that cannot say where it is could be past any batch picked: no stop is safe
            warnings.warn(
                f"lightning-ext: {who}; {counted}, but {ranks_text(silent, None)} did not say where they are:"
                " training goes on",
                stacklevel=1,
            )
            self.watchdog.tell_everyone(_AGREED, before="-1", signal="0")
            self.decided = False
            return
        before = max(int(position) for position in positions.values())
        self.watchdog.tell_everyone(_AGREED, before=str(before), signal=str(signalled[min(signalled)]))

    def _position(self) -> int:
        """The watchdog thread, asked by rank 0: the next point this rank can still stop at; it holds there."""
        with self._lock:
            self._holding = True
            self._agreed.clear()
            return self._next

    def _on_agreed(self, message: dict[str, str]) -> None:
        """The watchdog thread, told by rank 0: the point every rank stops at (``-1``: no stop after all)."""
        before = int(message["before"])
        with self._lock:
            self._before = before if before >= 0 else None
            self._number = int(message["signal"])
            self._holding = False
        self._agreed.set()

    def _at_batch_start(self) -> None:
        """In place of Lightning's ``_broadcast_sigterm_tensor``, before each training batch: stop if agreed."""
        if self._passed() and not self._loop._should_accumulate():  # the last batch ended its accumulation window
            self._stop(self._number, evaluation=None)

    def at_evaluation_batch(self, loop: Any) -> None:
        """After each evaluation batch of the fit (the sanity check's too): stop if agreed, unless a gradient
        accumulation window is open (a validation inside one: the stop waits for the window's end)."""
        trainer = self.trainer
        if self._loop is None or loop is not trainer.fit_loop.epoch_loop.val_loop:
            return
        if self._passed() and (trainer.sanity_checking or not self._loop._should_accumulate()):
            self._stop(self._number, evaluation=loop)

    def _passed(self) -> bool:
        """Pass this rank's next stop point, atomically with what rank 0 is told; whether a stop was agreed at it or
        before it."""
        while True:
            with self._lock:
                if not self._holding:
                    point, before, self._next = self._next, self._before, self._next + 1
                    return before is not None and point >= before
            self._wait_for_agreement()

    def _wait_for_agreement(self) -> None:
        """Wait for rank 0 to tell the agreed batch; an error posted meanwhile ends this rank with it."""
        while not self._agreed.wait(_HOLD_LOOK):
            posted = self.watchdog.posted()
            if posted is not None:
                self._flush()
                raise_record(posted)

    def _stop(self, number: int, evaluation: Any) -> NoReturn:
        """Every rank at the same point (before a training step, or after an evaluation batch of ``evaluation``):
        flush, checkpoint, tell, raise ``SIGTERMException``."""
        trainer = self.trainer
        if number == signal.SIGTERM:
            trainer._signal_connector.received_sigterm = True  # what user code and callbacks see under stock
        self._flush()
        batch, epoch = self._loop.batch_progress.total.ready, trainer.current_epoch
        if evaluation is None:
            where = f"before training batch {batch} (epoch {epoch})"
        else:
            done = evaluation.batch_progress.current.completed
            stage = "the sanity check" if trainer.sanity_checking else f"validation after training batch {batch - 1}"
            where = f"in {stage} (epoch {epoch}), after {done} validation batch(es)"
        path, resume = stop_checkpoint.save(trainer, number, evaluation is not None)
        if self.rank == 0:
            print(
                f"lightning-ext: stopped every rank {where}: {self._reason}; checkpoint {path}; {resume}",
                file=sys.stderr,
                flush=True,
            )
        else:
            self._outlive_no_parent()
        raise mark_joint(SIGTERMException(128 + number))

    def _outlive_no_parent(self) -> None:
        """Under Lightning's popen launcher, exit after rank 0 (the parent), so it does not kill itself with SIGKILL.

        Its child-process observer SIGKILLs rank 0 and every child when a child exits non-zero: this rank's 143
        would turn rank 0's into 137.
        """
        try:
            parent = int(self.watchdog.store.get("stop/parent"))  # type: ignore[attr-defined]
        except STORE_ERRORS:  # the store is gone, or rank 0 never wrote its pid: no parent to outlive
            return
        if parent == os.getppid():
            atexit.register(_wait_while_parent, parent, _PARENT_WAIT)


def _stop_signal(name: str, trainer: Any) -> int | None:
    """The signal number if ``name`` requests a stop: SIGTERM, or Lightning's SLURM requeue signal where it requeues."""
    if name == "SIGTERM":
        return int(signal.SIGTERM)
    environment = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        requeue = environment.requeue_signal
        if requeue is not None and signal.Signals(requeue).name == name:
            return int(requeue)
    return None


def _other_handlers(replaced: Any, number: int, frame: FrameType | None) -> None:
    """Run the handlers ``replaced`` holds (the user's, inside Lightning's compose), except Lightning's own.

    A compose (Lightning's ``_HandlersCompose``, or a note of lightning-ext's, which holds the handler it replaced) is
    walked into: Lightning puts the handler it finds into its compose, and a process may still hold an earlier
    trainer's (one whose teardown was cut short by an error), whose own SIGTERM handler would broadcast on this rank
    alone.
    """
    handlers = getattr(replaced, "signal_handlers", [replaced])
    for handler in handlers:
        if isinstance(handler, int):  # a signal number stands for its current handler, in Lightning's compose
            continue
        if hasattr(handler, "signal_handlers"):
            _other_handlers(handler, number, frame)
        elif callable(handler) and getattr(handler, "__name__", "") not in _REPLACED:
            handler(number, frame)


def _wait_while_parent(parent: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.05)
