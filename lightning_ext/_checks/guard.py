"""``HangGuard``: the hang checks and the stall report of one rank during one run, from set-up to teardown."""

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

from lightning.pytorch.trainer.states import TrainerStatus
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from lightning_ext import _collective, errors
from lightning_ext._checks import loaders, logs
from lightning_ext._checks.channel import open_channel
from lightning_ext._checks.lockstep import Lockstep, record_of
from lightning_ext._checks.messages import signalled_message
from lightning_ext._checks.points import Point, collective_point
from lightning_ext._files.storage import guarded
from lightning_ext._preemption.stop import StopController
from lightning_ext._stall import monitor as stall
from lightning_ext._watch import ddp_forward
from lightning_ext._watch.facts import Recorder, SignalConsumer
from lightning_ext._watch.sites import called_as
from lightning_ext._watch.watchdog import Watchdog, raise_record
from lightning_ext.errors import is_joint
from lightning_ext.policies import VotePolicy

__all__ = ["HangChecks", "HangGuard", "UnevenMode", "active", "validate_options"]

HangChecks = bool | Literal["debug"]
UnevenMode = Literal["error", "truncate"]


def validate_options(hang_checks: Any, uneven_batches: Any, check_unsized_loaders: Any) -> None:
    """Raise ``ValueError``/``TypeError`` naming a bad option (at construction, before any collective)."""
    if hang_checks not in (True, False, "debug"):
        raise ValueError(f"hang_checks must be True, False or 'debug', got {hang_checks!r}")
    if uneven_batches not in ("error", "truncate"):
        raise ValueError(f"uneven_batches must be 'error' or 'truncate', got {uneven_batches!r}")
    if not isinstance(check_unsized_loaders, bool):
        raise TypeError(f"check_unsized_loaders must be a bool, got {check_unsized_loaders!r}")


_ACTIVE: "HangGuard | None" = None  # the guard whose watchdog runs now (the evaluation batches' seam asks it)


def active() -> "HangGuard | None":
    """The running guard, if its watchdog runs (the checks, the stall report, or both)."""
    return _ACTIVE


class HangGuard:
    """The checks of one rank during one fit/validate/test/predict.

    Args:
        mode: ``True`` (the default checks) or ``"debug"`` (also every ``all_gather``).
        uneven_batches: ``"error"`` or ``"truncate"``.
        check_unsized_loaders: compare loaders without a length after every batch.
        flush: writes this rank's buffered per-rank rows (called before any error is raised).
        stall_options: the stall report's options.
        preemption_policy: decides a coordinated stop when ranks receive SIGTERM (``None``: off).
        waiting: around each check's exchange, where this rank waits for the others (per-rank telemetry times it).
        channel_timeout: seconds the checks' channel may take to connect at set-up.

    """

    def __init__(
        self,
        mode: HangChecks,
        uneven_batches: UnevenMode,
        check_unsized_loaders: bool,
        flush: Callable[[], None],
        stall_options: stall.StallOptions,
        preemption_policy: VotePolicy | None = None,
        waiting: Callable[[], AbstractContextManager[None]] = nullcontext,
        channel_timeout: float = 30.0,
    ) -> None:
        if (
            isinstance(channel_timeout, bool)
            or not isinstance(channel_timeout, (int, float))
            or not channel_timeout > 0
        ):
            raise ValueError(f"check_channel_timeout must be a positive number of seconds, got {channel_timeout!r}")
        self.mode = mode
        self.channel_timeout = channel_timeout
        self._waiting = waiting
        self.preemption_policy = preemption_policy
        self.preemption: StopController | None = None
        self.uneven_batches: UnevenMode = uneven_batches
        self.check_unsized_loaders = check_unsized_loaders
        self.stall_options = stall_options
        self._flush = flush
        self.recorder: Recorder | None = None
        self.watchdog: Watchdog | None = None
        self.lockstep: Lockstep | None = None
        self.monitor: stall.StallMonitor | None = None

    def start(
        self,
        rank: int,
        world_size: int,
        namespace: str,
        trainer: Any,
        peers: list[stall.Introduction],
        routes: list[str | None],
    ) -> None:
        """Start the checks and the stall monitor, where on (every rank, at set-up, after the process group exists).

        ``peers``: every rank's :func:`stall.introduction`; ``routes``: every rank's route to ``MASTER_ADDR`` (the
        local address it leaves from); both exchanged at set-up.
        """
        wanted = self.mode or self.stall_options.stall_timeout is not None
        if not wanted or world_size < 2 or not _collective.is_initialized():
            return
        channel = None
        if self.mode:  # first: where it cannot connect, every rank warns (the checks are off) or raises alike
            hosts, store = [host for _, host, _ in peers], _collective.default_store(namespace)
            channel = open_channel(store, rank, routes, hosts, self.channel_timeout, self.uneven_batches == "truncate")
            self.mode = self.mode if channel is not None else False
        recorder = self.recorder = Recorder(rank, world_size, trainer)
        recorder.install()
        watchdog = self.watchdog = Watchdog(namespace, recorder)
        recorder.on_signal = self._on_signal
        if self.preemption_policy is not None:
            self.preemption = StopController(self.preemption_policy, watchdog, self._safe_flush)
        if channel is not None:
            self.lockstep = Lockstep(channel, watchdog, self._safe_flush)
            self.lockstep.waiting = self._waiting
            logs.start(self.lockstep, trainer)
            loaders.start(loaders.LoaderChecks(self.lockstep, self.uneven_batches, self.check_unsized_loaders))
        self.monitor = stall.start(self.stall_options, recorder, watchdog, namespace, peers, self._safe_flush)
        if self.monitor is not None:
            watchdog.on_error = self._on_posted
        global _ACTIVE
        _ACTIVE = self

    def finish(self, trainer: Any) -> None:
        """A last check when a fit/validate/test ends normally: every rank must end it, not wait at another check."""
        if self.lockstep is None or trainer is None or trainer.state.status != TrainerStatus.RUNNING:
            return
        stage = trainer.state.fn.value if trainer.state.fn is not None else "the run"
        self.lockstep.require(Point("end", ("end", stage), f"the end of {stage} (this rank finished)"))

    def stop(self) -> None:
        """Stop the coordinated stop, the checks, the stall monitor and the watchdog (teardown)."""
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        recorder, watchdog, lockstep, monitor = self.recorder, self.watchdog, self.lockstep, self.monitor
        self.recorder = self.watchdog = self.lockstep = self.monitor = None
        preemption, self.preemption = self.preemption, None
        if preemption is not None:
            preemption.detach()
        if recorder is None or watchdog is None:
            return
        if monitor is not None:
            monitor.stop()
        if lockstep is not None:
            logs.stop()
            loaders.stop()
        recorder.uninstall()
        watchdog.stop()  # a store already gone is its own concern (it stops its thread without one)
        if lockstep is not None:
            lockstep.close()
        # once no thread of this run can use them, the store connections serve the next run in this process
        clients = watchdog.idle_clients()
        if monitor is not None:
            monitor_clients = monitor.idle_clients()
            clients = clients + monitor_clients if monitor_clients else []
        if clients:
            _collective.release_store_clients(clients)

    def watch_signals(self) -> None:
        """Note the signals this rank receives from now on (once Lightning has installed its handlers)."""
        if self.recorder is not None:
            self.recorder.watch_signals()
        if self.preemption is not None:
            self.preemption.attach()  # in a fit, in place of Lightning's per-step broadcast

    def watch_passes(self, strategy: Any) -> None:
        """Note when ``strategy``'s rank is in a backward pass, and whether DDP all-reduces its gradients; and when it
        is in a forward pass of a DDP model that broadcasts before the module runs (the rebuilt gradient buckets'
        order, once; the buffers), a collective call made in DDP's C++ code that no count of ``torch.distributed``
        calls sees (:mod:`~lightning_ext._watch.ddp_forward`).

        The autograd backward runs inside the precision plugin's ``backward``; ``on_after_backward`` (which may log)
        runs after it returns, outside the pass. Only a DDP model's sync is known (``require_backward_grad_sync`` is
        off within ``no_sync``, when gradients accumulate); under other strategies the pass is not reported.
        """
        plugin, recorder = strategy.precision_plugin, self.recorder
        if recorder is None:
            return
        ddp_forward.watch(strategy.model, recorder)
        if "backward" in plugin.__dict__:
            return
        backward = plugin.backward

        def watched_backward(*args: Any, **kwargs: Any) -> Any:
            model = strategy.model
            synced = bool(model.require_backward_grad_sync) if isinstance(model, DistributedDataParallel) else None
            with recorder.backward_pass(synced):
                return backward(*args, **kwargs)

        plugin.__dict__["backward"] = watched_backward

    @staticmethod
    def unwatch_passes(strategy: Any) -> None:
        """Undo :meth:`watch_passes`."""
        strategy.precision_plugin.__dict__.pop("backward", None)
        ddp_forward.unwatch(strategy.model)

    def reduce(self, reduce: Callable[..., Any], tensor: Any, group: Any, reduce_op: Any) -> Any:
        """``strategy.reduce`` with a check in place of Lightning's barrier."""
        checks = logs.active()
        if self.lockstep is None or checks is None or not _collective.is_world(group) or not isinstance(tensor, Tensor):
            return reduce(tensor, group=group, reduce_op=reduce_op)
        logs.check_reduce(checks, tensor, reduce_op)
        with self.lockstep.recorder.barrier_skipped(checked=True):  # the check above is that barrier
            return reduce(tensor, group=group, reduce_op=reduce_op)

    def check_pack(self, metrics: list[Any], phase: str, layout: tuple[Any, ...]) -> None:
        """Before the coalesced sync of ``metrics``' ``phase`` values (packed as ``layout`` says): a hook's step values
        are checked together (an epoch round's were checked when the round started)."""
        checks = logs.active()
        if self.lockstep is not None and checks is not None and phase == "step":
            logs.check_pack(checks, metrics, layout)

    def without_barrier(self) -> AbstractContextManager[None]:
        """Within the block, the training thread skips Lightning's barrier before an all-reduce: a check lined the
        ranks up (or, with the checks off, the coalesced sync's all-reduce needs none), where the counting wrappers are
        in place. With the checks and the stall report off, ``torch.distributed`` is left alone: the barrier runs."""
        if self.recorder is None:
            return nullcontext()
        return self.recorder.barrier_skipped(checked=self.lockstep is not None)

    def evaluation_batch_ended(self, loop: Any) -> None:
        """After each evaluation or prediction batch: an error another rank posted ends this rank here (a SIGTERM on
        one rank outside a fit, a rank that failed); in a fit, so does an agreed preemption stop. No collective."""
        if self.watchdog is None:
            return
        posted = self.watchdog.posted()
        if posted is not None:
            self._safe_flush()
            raise_record(posted)
        if self.preemption is not None:
            self.preemption.at_evaluation_batch(loop)

    def check_call(self, call: str, identity: tuple[Any, ...], *, debug_only: bool = False) -> None:
        """Check before a collective call of the strategy (``barrier``, ``broadcast``, ``all_gather``)."""
        if self.lockstep is None or (debug_only and self.mode != "debug") or not _collective.is_initialized():
            return
        self.lockstep.require(collective_point(call, identity, called_as(sys._getframe(1))))

    def on_failure(self, error: BaseException, rank: int) -> None:
        """A fit/validate/test raised on this rank: flush, then make every rank end with the same error.

        If this rank's error is a collective that failed because another rank's process ended, raise that rank's
        posted error instead. Otherwise this rank's error is genuine: post it (the first error posted wins), so that
        ranks blocked in collectives with this one learn why; the caller then re-raises it here.
        """
        self._safe_flush()
        if self.monitor is not None:
            stalled = self.monitor.on_failure(error)
            if stalled is not None:  # a stall was (or is now) established: what this rank raised is its consequence
                raise_record(stalled, cause=error)
        lockstep = self.lockstep
        if lockstep is None or is_joint(error):
            return
        posted = lockstep.watchdog.read_posted()
        if posted is not None and posted.rank != rank and _collective.is_communication_failure(error):
            raise_record(posted, cause=error)
        lockstep.watchdog.post(record_of(error, rank, joint=False, recorder=lockstep.recorder))

    def _on_signal(self, name: str, text: str) -> SignalConsumer | None:
        """In a fit, request the coordinated stop (:mod:`~lightning_ext._preemption.stop`); otherwise, on SIGTERM, end
        every rank with one ``RankSignalledError`` instead of running Lightning's handler.

        Lightning's SIGTERM handler makes a collective call (a broadcast) on the signalled rank alone, which pairs with
        whatever collective the other ranks make next: the job hangs (Lightning #20806) or mixes up values. Here the
        first signalled rank's error is posted (the first post wins, so a signal to every rank still gives one
        message) and raised at once; the other ranks learn of it from their watchdogs.
        """
        consumer = None if self.preemption is None else self.preemption.on_signal(name)
        watchdog = self.watchdog
        if consumer is not None or name != "SIGTERM" or watchdog is None:
            return consumer
        error = errors.RankSignalledError(signalled_message(watchdog.rank, text))
        if self.lockstep is not None:
            self.lockstep.fail_alone(error)
        self._safe_flush()  # no checks: posted through the stall report's watchdog, the same error on every rank
        raise_record(watchdog.post(record_of(error, watchdog.rank, joint=False, recorder=self.recorder)), cause=error)

    def _on_posted(self) -> None:
        """An error was posted (the watchdog thread): join the pending checks; a stall also ends this rank."""
        if self.lockstep is not None:
            self.lockstep.complete_pending()
        if self.monitor is not None:
            self.monitor.on_error()

    def _safe_flush(self) -> None:
        with guarded():  # a diagnostic must never stand in the way of the real error
            self._flush()
