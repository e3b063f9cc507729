"""``PolicyStrategyMixin``: the policies, per-rank metrics and hang checks for any Lightning ``ParallelStrategy``."""

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import ParallelStrategy
from typing_extensions import override

from lightning_ext import _collective
from lightning_ext._checks.guard import HangChecks, HangGuard, UnevenMode, validate_options
from lightning_ext._collective import RankGroup
from lightning_ext._decisions import checkpoint, early_stopping
from lightning_ext._decisions.record_file import DecisionFile
from lightning_ext._packages.choice import (
    Package,
    check_one_package,
    package_of,
    parts_of_run,
    strategy_for_other_package,
)
from lightning_ext._per_rank import local_values
from lightning_ext._per_rank.logger import RankMetricsLogger, loggers_for
from lightning_ext._per_rank.sinks import sinks_for
from lightning_ext._per_rank.writer import PerRankMetrics
from lightning_ext._preemption.stop import resolve_preemption_policy
from lightning_ext._setup import checks as setup_checks
from lightning_ext._stall.monitor import StallOptions
from lightning_ext._sync import hooks as sync_hooks
from lightning_ext._sync.hooks import LogSync
from lightning_ext._sync.queue import SyncQueue
from lightning_ext._telemetry import step_timer
from lightning_ext._telemetry.live_stragglers import start_telemetry
from lightning_ext._telemetry.telemetry import Telemetry
from lightning_ext.policies import DecisionPolicy, resolve_policy
from lightning_ext.strategies import _compat, _runtime
from lightning_ext.strategies._class_checks import check_base, check_order
from lightning_ext.strategies._collectives import CollectiveSeams
from lightning_ext.strategies._options import StrategyOptions, give_init, mixin_signature
from lightning_ext.strategies._set_up import agree, invalid_policies

__all__ = ["PolicyStrategyMixin"]

# To type checkers the mixin is the strategy it is mixed into; at run time it sits before it in the MRO.
if TYPE_CHECKING:
    _Strategy = ParallelStrategy
else:
    _Strategy = object


class PolicyStrategyMixin(CollectiveSeams, _Strategy):
    """Adds decision policies and per-rank metrics to a Lightning ``ParallelStrategy`` subclass.

    Put it first in the bases: ``class MyStrategy(PolicyStrategyMixin, DDPStrategy)``. It takes these keyword-only
    arguments and passes every other argument to the strategy. A subclass that defines no ``__init__`` gets one whose
    signature is its strategy's parameters and then these options, so ``inspect.signature`` and LightningCLI see them
    all (``lightning_ext/strategies/_options.py`` defines the options once):

    Args:
        checkpoint_policy: how ranks agree to save a new top-k checkpoint. Default ``"all"`` (stock Lightning).
        early_stopping_policy: how ranks agree to stop. Default ``"any"`` (stock Lightning).
        per_rank_metrics: ``True`` (or :class:`~lightning_ext.PerRankMetrics`): every rank writes its own values.
        hang_checks: ``True`` (default) turns the pitfalls that freeze DDP jobs (uneven batches, synced logging on
            some ranks only, ``barrier``/``broadcast``/``trainer.log_dir``/``trainer.save_checkpoint`` under a rank
            guard, one rank failing) into the same error on every rank; ``"debug"`` also checks every
            ``all_gather``; ``False`` switches them off.
        uneven_batches: ``"error"`` (default) or ``"truncate"``: what to do when the ranks' dataloaders have
            different numbers of batches in an epoch.
        check_unsized_loaders: compare loaders without a length after every batch (one small check per step).
        check_channel_timeout: seconds the checks' channel may take to connect at set-up (then: docs/multi-node.md).
        decision_record: ``True`` (default): with a logger, rank 0 records every decision, every rank's value and vote
            and why, in ``<log_dir>/decisions.csv`` (``docs/decision-record.md``); ``False``: no record.
        preemption_policy: when SIGTERM (or Lightning's SLURM requeue signal) on some ranks stops every rank at the
            same step, with a checkpoint (docs/stalls-and-preemption.md). Default ``"any"``: one signalled rank is
            enough; ``"all"``, ``"majority"``, ``"rank_zero"``, a ``VotePolicy``; ``None``: ``RankSignalledError``.
        stall_timeout: seconds a rank may wait for the others while no rank makes progress before every rank writes
            the stall report (``<log_dir>/stall_report.txt``) and the run ends with ``StallError``; ``"auto"``
            (default) reports shortly before the process group's timeout and ends the run only at it; ``None``: off.
        on_stall: ``"error"`` (default) or ``"report"`` (write the report, keep waiting).
        log_sync: ``"coalesced"`` (default): the values a hook logs with ``sync_dist=True`` sync together when the
            hook returns, in one all-reduce per reduce op and dtype (and an epoch-end round's values together);
            ``"per_value"``: each value syncs inside its ``self.log``, as stock Lightning does (docs/synced-logging.md).

    Raises:
        TypeError: at construction, the class is not a ``ParallelStrategy``, or it overrides
            ``reduce_boolean_decision`` with one that Lightning's callbacks cannot call as they call the stock one
            (``(decision)``, ``(decision, all=False)``) or that is not a method; at class definition, a strategy
            class comes before the mixin in the bases.

    """

    _lightning_package: ClassVar[Package] = _compat.PACKAGE  # this module is compiled once per Lightning package

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        base = package_of(cls)
        if base is not None and base != cls._lightning_package:  # the mixin of one package on the other's strategy
            raise strategy_for_other_package(cls, cls._lightning_package, base, f"{cls.__name__}'s base strategy")
        # here, because with the mixin after the strategy, its __init__ would not run to check it
        check_order(cls, PolicyStrategyMixin)
        give_init(cls, PolicyStrategyMixin)

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # its signature: the options' (below the class)
        self._check_buildable()
        options = StrategyOptions.take(kwargs)
        check_base(type(self), PolicyStrategyMixin)
        if not isinstance(options.decision_record, bool):
            raise TypeError(f"decision_record must be True or False, got {options.decision_record!r}")
        validate_options(options.hang_checks, options.uneven_batches, options.check_unsized_loaders)
        preemption = resolve_preemption_policy(options.preemption_policy)
        stall_options = StallOptions(options.stall_timeout, options.on_stall)  # raises on a bad option
        sync_hooks.validate_log_sync(options.log_sync)
        _runtime.install()
        if not _runtime.seams_available():
            raise RuntimeError(
                "lightning-ext cannot reach Lightning's callbacks: the installed Lightning is not patched and runtime"
                " patching is switched off (LIGHTNING_EXT_RUNTIME_PATCHING=0). Apply the seams with"
                " `python -m lightning_ext.patches apply`, or unset the variable."
            )
        super().__init__(*args, **kwargs)
        self._checkpoint_policy = resolve_policy(options.checkpoint_policy)
        self._early_stopping_policy = resolve_policy(options.early_stopping_policy)
        per_rank_metrics = options.per_rank_metrics
        if not isinstance(per_rank_metrics, (bool, PerRankMetrics)):
            raise TypeError(f"per_rank_metrics must be a bool or PerRankMetrics, got {type(per_rank_metrics).__name__}")
        self._per_rank_metrics = PerRankMetrics() if per_rank_metrics is True else (per_rank_metrics or None)
        # the options as set-up's exchange compares them across ranks (policies resolved: "all" is AllRanks())
        self._options = dataclasses.replace(
            options,
            checkpoint_policy=self._checkpoint_policy,
            early_stopping_policy=self._early_stopping_policy,
            per_rank_metrics=self._per_rank_metrics or False,
            preemption_policy=preemption,
        )
        self._run_log_dir: str | None = None
        self.rank_metrics_logger: RankMetricsLogger | None = None
        self._telemetry: Telemetry | None = None
        self._step_timer: step_timer.StepTimer | None = None  # times the phases below while telemetry is on
        self._gradient_wait: step_timer.GradientWait | None = None  # and the wait at the end of each backward pass
        self._hang_guard = HangGuard(
            options.hang_checks,
            options.uneven_batches,
            options.check_unsized_loaders,
            self._flush_rank_files,
            stall_options,
            preemption,
            self._timing_collectives,  # a bound method, not a lambda: the strategy is pickled to each rank (spawn)
            options.check_channel_timeout,
        )
        self._decision_record = options.decision_record
        self.decision_file: DecisionFile | None = None  # rank 0's record, during a run
        self._log_sync = options.log_sync
        self._sync_queue: SyncQueue | None = None  # the synced logged values held until their hook ends, during a run

    def _timing_collectives(self) -> step_timer.timing:
        """Time what runs inside as telemetry's collectives (nothing while telemetry is off)."""
        return step_timer.timing(self._step_timer, step_timer.COLLECTIVES)

    @classmethod
    def _check_buildable(cls) -> None:
        """Raise if the strategy cannot be built here (``PolicyDeepSpeedStrategy``: DeepSpeed is not installed)."""

    @property
    def checkpoint_policy(self) -> DecisionPolicy:
        """The policy of the ``ModelCheckpoint`` top-k decision."""
        return self._checkpoint_policy

    @property
    def early_stopping_policy(self) -> DecisionPolicy:
        """The policy of the ``EarlyStopping`` stop decision."""
        return self._early_stopping_policy

    @property
    def per_rank_metrics(self) -> PerRankMetrics | None:
        """The per-rank metrics options, or ``None`` when per-rank files are off."""
        return self._per_rank_metrics

    @property
    def hang_checks(self) -> HangChecks:
        """Whether the hang checks are on (``True``), off (``False``), or in ``"debug"`` mode."""
        return self._hang_guard.mode

    @property
    def log_sync(self) -> LogSync:
        """How synced logged values sync: ``"coalesced"`` (per hook, together) or ``"per_value"`` (as stock)."""
        return self._log_sync

    @property
    def preemption_policy(self) -> DecisionPolicy | None:
        """The policy that decides a coordinated stop on preemption signals, or ``None`` (off)."""
        return self._hang_guard.preemption_policy

    @property
    def uneven_batches(self) -> UnevenMode:
        """What happens when the ranks' dataloaders have different numbers of batches: ``"error"`` or ``"truncate"``."""
        return self._hang_guard.uneven_batches

    @property
    def stall_options(self) -> StallOptions:
        """The stall report's options: ``stall_timeout`` and ``on_stall``."""
        return self._hang_guard.stall_options

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        # a spawned rank unpickles the strategy before Trainer._run: the seams must be in place before that call
        _runtime.install()
        super().__setstate__(state)

    @override
    def setup_environment(self) -> None:
        _runtime.install()  # a spawned or re-launched process imports us afresh
        self._check_one_package()  # before the process group: every rank raises alike, none waits
        super().setup_environment()
        namespace, peers, routes = self._agree_at_set_up()
        self._hang_guard.start(self._rank(), self.world_size, namespace, self._trainer(), peers, routes)
        if self._log_sync == "coalesced" and _collective.is_initialized():
            self._sync_queue = SyncQueue(self._reduce_packed, self._hang_guard.check_pack)
            sync_hooks.start(self._sync_queue, self._rank(), self.world_size)
        setup_checks.start(setup_checks.SetupChecks(RankGroup.from_strategy(self), self._trainer()))

    @override
    @contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        with setup_checks.inside_init_module(), super().tensor_init_context(empty_init=empty_init):
            yield

    @override
    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        self._hang_guard.watch_passes(self)
        if self._per_rank_metrics is None or self._run_log_dir is None:
            return
        sinks = sinks_for(trainer, self._rank(), self._per_rank_metrics, self._main_runs)
        self.rank_metrics_logger = RankMetricsLogger(self._run_log_dir, self._rank(), self._per_rank_metrics, sinks)
        local_values.start_capture(self._rank())
        if trainer.loggers:  # a member for the run, so it also gets what callbacks send to every logger
            trainer.loggers = [*trainer.loggers, self.rank_metrics_logger]

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        self._hang_guard.watch_signals()  # Lightning installed its signal handlers just before the loops started
        trainer = self._trainer()
        if self.decision_file is not None and trainer is not None and trainer.ckpt_path is not None:
            self.decision_file.resume_from_step = trainer.global_step  # later decisions are made again
        if self.rank_metrics_logger is not None and trainer is not None and trainer.ckpt_path is not None:
            # resumed: rows after the checkpoint's step will be logged again, so the writer drops them from the file
            self.rank_metrics_logger.resume_from_step = trainer.fit_loop.epoch_loop._batches_that_stepped
        options = self._per_rank_metrics
        if self.rank_metrics_logger is not None and trainer is not None and options is not None and options.telemetry:
            cuda = self.root_device if self.root_device.type == "cuda" else None
            telemetry = start_telemetry(
                self.rank_metrics_logger, trainer, options, self._rank(), self.world_size, cuda,
                self._hang_guard.watchdog, self._run_log_dir,
            )  # fmt: skip
            self._telemetry, self._step_timer, self._gradient_wait = telemetry, telemetry.timer, telemetry.gradient_wait

    @override
    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._hang_guard.watch_signals()  # for validate() (within fit, on_train_start already did)

    @override
    def on_test_start(self) -> None:
        super().on_test_start()
        self._hang_guard.watch_signals()

    @override
    def on_predict_start(self) -> None:
        super().on_predict_start()
        self._hang_guard.watch_signals()

    @override
    def teardown(self) -> None:
        telemetry, self._telemetry, self._step_timer, self._gradient_wait = self._telemetry, None, None, None
        if telemetry is not None:
            telemetry.detach()  # its last row, and the methods it shadowed given back before the others' (the stop's)
        self._stop_coalescing()
        self._hang_guard.unwatch_passes(self)
        setup_checks.stop()
        try:
            self._hang_guard.finish(self._trainer())
        finally:
            self._hang_guard.stop()
        decision_file, self.decision_file = self.decision_file, None
        if decision_file is not None:
            decision_file.close()
        rank_logger, self.rank_metrics_logger = self.rank_metrics_logger, None
        if rank_logger is not None:
            local_values.stop_capture()
            rank_logger.close()
            trainer = self._trainer()
            if trainer is not None and rank_logger in trainer.loggers:
                trainer.loggers = [logger for logger in trainer.loggers if logger is not rank_logger]
        super().teardown()

    def save_topk_with_policy(self, callback: Any, trainer: Any, monitor_candidates: dict[str, Any]) -> bool:
        """The ``ModelCheckpoint`` seam: decide the top-k save under :attr:`checkpoint_policy`."""
        return checkpoint.save_topk_checkpoint(callback, trainer, monitor_candidates)

    def prepare_topk_decision(self, callback: Any, trainer: Any, monitor_candidates: dict[str, Any]) -> None:
        """The ``ModelCheckpoint.on_train_batch_end`` seam: decide a due step-based save on every rank, up front."""
        checkpoint.prepare_topk_decision(callback, trainer, monitor_candidates)

    def run_early_stopping_with_policy(self, callback: Any, trainer: Any) -> bool:
        """The ``EarlyStopping`` seam: decide the stop under :attr:`early_stopping_policy`."""
        return early_stopping.run_early_stopping_check(callback, trainer)

    def loggers_for_log_metrics(self, trainer: Any, metrics: dict[str, Any]) -> list[Logger]:
        """The logger connector's seam: the loggers one row goes to (with this rank's per-rank logger)."""
        return loggers_for(trainer, metrics)

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        return step_timer.timed(self._step_timer, step_timer.FORWARD, super().training_step, *args, **kwargs)

    @override
    def backward(self, *args: Any, **kwargs: Any) -> Any:
        return step_timer.timed_backward(self._gradient_wait, super().backward, *args, **kwargs)

    @override
    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        return step_timer.timed(self._step_timer, step_timer.OPTIMIZER, super().optimizer_step, *args, **kwargs)

    def on_run_failure(self, error: BaseException) -> None:
        """The ``Trainer._run`` seam: a fit/validate/test raised on this rank (see :class:`HangGuard.on_failure`)."""
        self._stop_coalescing()  # the values still held die with the run: Lightning's on_exception hooks follow
        self._hang_guard.on_failure(error, self._rank())

    def _check_one_package(self) -> None:
        """Raise if the run holds objects of the other Lightning package (they would escape the seams silently)."""
        check_one_package(self._lightning_package, parts_of_run(self, self._trainer()), type(self).__name__)

    def _stop_coalescing(self) -> None:
        if self._sync_queue is not None:
            sync_hooks.stop()
            self._sync_queue = None

    def _flush_rank_files(self) -> None:
        if self.rank_metrics_logger is not None:
            self.rank_metrics_logger.flush()

    def _rank(self) -> int:
        return int(self.global_rank)

    def _trainer(self) -> Any:
        """The trainer, or ``None`` (``module.trainer`` raises when unattached: the launching process under spawn)."""
        module = self.lightning_module
        return None if module is None else getattr(module, "_trainer", None)

    def _agree_at_set_up(self) -> tuple[str, list[Any], list[str | None]]:
        """Set-up's one exchange (see :func:`~lightning_ext.strategies._set_up.agree`); returns the store namespace,
        every rank's introduction to the stall monitor and its route to ``MASTER_ADDR``."""
        guard = self._hang_guard
        policies = (self._checkpoint_policy, self._early_stopping_policy, guard.preemption_policy)
        invalid = invalid_policies(*policies, world_size=self.world_size)
        trainer, ranks = self._trainer(), RankGroup.from_strategy(self)
        options = self._options.described()
        agreed = agree(trainer, ranks, options, invalid, self._per_rank_metrics is not None, self._decision_record)
        self._run_log_dir, self._main_runs = agreed.log_dir, agreed.runs  # main runs: MLflow's, W&B's (rank 0's)
        if ranks.rank == 0 and agreed.record_dir is not None:  # the run's id: its namespace's
            self.decision_file = DecisionFile(agreed.record_dir, agreed.namespace.split("/")[1][:12])
        return agreed.namespace, agreed.peers, agreed.routes


PolicyStrategyMixin.__init__.__signature__ = mixin_signature(PolicyStrategyMixin.__init__)  # type: ignore[attr-defined]
