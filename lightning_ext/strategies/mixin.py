"""``PolicyStrategyMixin``: policies, per-rank metrics, hang checks and the stall report for a ``ParallelStrategy``."""

import inspect
import uuid
from typing import TYPE_CHECKING, Any

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.strategies import ParallelStrategy, Strategy
from typing_extensions import override

from lightning_ext import _collective
from lightning_ext._collective import RankGroup, all_gather_objects
from lightning_ext._decisions import checkpoint, early_stopping
from lightning_ext._hang.guard import HangChecks, HangGuard, UnevenMode, validate_options
from lightning_ext._hang.stall import OnStall, StallOptions, introduction
from lightning_ext._per_rank import local_values
from lightning_ext._per_rank.logger import RankCSVLogger, loggers_for
from lightning_ext.errors import PolicyMismatchError, mark_joint
from lightning_ext.policies import DecisionPolicy, PolicyLike, resolve_policy
from lightning_ext.rank_metrics import PerRankMetrics
from lightning_ext.strategies import _runtime

__all__ = ["PolicyStrategyMixin"]

# To type checkers the mixin is the strategy it is mixed into; at run time it sits before it in the MRO.
if TYPE_CHECKING:
    _Strategy = ParallelStrategy
else:
    _Strategy = object


class PolicyStrategyMixin(_Strategy):
    """Adds decision policies and per-rank metrics to a Lightning ``ParallelStrategy`` subclass.

    Put it first in the bases: ``class MyStrategy(PolicyStrategyMixin, DDPStrategy)``. It takes these keyword-only
    arguments and passes every other argument to the strategy:

    Args:
        checkpoint_policy: how ranks agree to save a new top-k checkpoint. Default ``"all"`` (stock Lightning).
        early_stopping_policy: how ranks agree to stop. Default ``"any"`` (stock Lightning).
        per_rank_metrics: ``True`` (or :class:`~lightning_ext.PerRankMetrics` options) to have every rank write its
            own, un-synced values of every logged row to ``<log_dir>/rank_<r>/metrics.csv``.
        hang_checks: ``True`` (default) turns the pitfalls that freeze DDP jobs (uneven batches, synced logging on
            some ranks only, ``barrier``/``broadcast``/``trainer.log_dir``/``trainer.save_checkpoint`` under a rank
            guard, one rank failing) into the same error on every rank; ``"debug"`` also checks every
            ``all_gather``; ``False`` switches them off.
        uneven_batches: ``"error"`` (default) or ``"truncate"``: what to do when the ranks' dataloaders have
            different numbers of batches in an epoch.
        check_unsized_loaders: compare loaders without a length after every batch (one small check per step).
        stall_timeout: seconds a rank may wait for the others while no rank makes progress before every rank writes
            the stall report (``<log_dir>/stall_report.txt``) and the run ends with ``StallError``; ``"auto"``
            (default) reports shortly before the process group's timeout and ends the run only at it; ``None``: off.
        on_stall: ``"error"`` (default) or ``"report"`` (write the report, keep waiting).

    Raises:
        TypeError: at construction, the class is not a ``ParallelStrategy``, or it overrides
            ``reduce_boolean_decision`` with one that Lightning's callbacks cannot call as they call the stock one
            (``(decision)``, ``(decision, all=False)``) or that is not a method; at class definition, a strategy
            class comes before the mixin in the bases.

    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_order(cls)  # here, because with the mixin after the strategy, its __init__ would not run to check it

    def __init__(
        self,
        *args: Any,
        checkpoint_policy: PolicyLike = "all",
        early_stopping_policy: PolicyLike = "any",
        per_rank_metrics: bool | PerRankMetrics = False,
        hang_checks: HangChecks = True,
        uneven_batches: UnevenMode = "error",
        check_unsized_loaders: bool = False,
        stall_timeout: float | str | None = "auto",
        on_stall: OnStall = "error",
        **kwargs: Any,
    ) -> None:
        _check_base(type(self))
        validate_options(hang_checks, uneven_batches, check_unsized_loaders)
        stall_options = StallOptions(stall_timeout, on_stall)  # raises on a bad option
        _runtime.install()
        if not _runtime.seams_available():
            raise RuntimeError(
                "lightning-ext cannot reach Lightning's callbacks: the installed Lightning is not patched and runtime"
                " patching is switched off (LIGHTNING_EXT_RUNTIME_PATCHING=0). Apply the seams with"
                " `python -m lightning_ext.patches apply`, or unset the variable."
            )
        super().__init__(*args, **kwargs)
        self._checkpoint_policy = resolve_policy(checkpoint_policy)
        self._early_stopping_policy = resolve_policy(early_stopping_policy)
        if not isinstance(per_rank_metrics, (bool, PerRankMetrics)):
            raise TypeError(f"per_rank_metrics must be a bool or PerRankMetrics, got {type(per_rank_metrics).__name__}")
        self._per_rank_metrics = PerRankMetrics() if per_rank_metrics is True else (per_rank_metrics or None)
        self._run_log_dir: str | None = None
        self.rank_metrics_logger: RankCSVLogger | None = None
        self._hang_guard = HangGuard(
            hang_checks, uneven_batches, check_unsized_loaders, self._flush_rank_files, stall_options
        )

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
        super().setup_environment()
        namespace, peers = self._agree_at_set_up()
        self._hang_guard.start(self._rank(), self.world_size, namespace, self._trainer(), peers)

    @override
    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        self._hang_guard.watch_backward_passes(self)
        if self._per_rank_metrics is None or self._run_log_dir is None:
            return
        self.rank_metrics_logger = RankCSVLogger(self._run_log_dir, self._rank(), self._per_rank_metrics)
        local_values.start_capture(self._rank())
        if trainer.loggers:  # a member for the run, so it also gets what callbacks send to every logger
            trainer.loggers = [*trainer.loggers, self.rank_metrics_logger]

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        self._hang_guard.watch_signals()  # Lightning installed its signal handlers just before the loops started
        trainer = self._trainer()
        if self.rank_metrics_logger is not None and trainer is not None and trainer.ckpt_path is not None:
            # resumed: rows after the checkpoint's step will be logged again, so the writer drops them from the file
            self.rank_metrics_logger.resume_from_step = trainer.fit_loop.epoch_loop._batches_that_stepped

    @override
    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._hang_guard.watch_signals()  # for validate() (within fit, on_train_start already did)

    @override
    def on_test_start(self) -> None:
        super().on_test_start()
        self._hang_guard.watch_signals()

    @override
    def teardown(self) -> None:
        self._hang_guard.unwatch_backward_passes(self)
        try:
            self._hang_guard.finish(self._trainer())
        finally:
            self._hang_guard.stop()
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
    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        tensor = _collective.exact_mean_input(tensor, reduce_op)
        return self._hang_guard.reduce(super().reduce, tensor, group, reduce_op)  # type: ignore[safe-super]

    @override
    def barrier(self, name: str | None = None) -> None:
        self._hang_guard.check_call(f"strategy.barrier({name!r})", ("barrier", name))
        super().barrier(name)  # type: ignore[safe-super]

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        self._hang_guard.check_call(f"strategy.broadcast(src={src})", ("broadcast", src))
        return super().broadcast(obj, src)  # type: ignore[safe-super]

    @override
    def all_gather(self, tensor: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        if _collective.is_world(group):
            shape = tuple(tensor.shape) if hasattr(tensor, "shape") else None
            identity = ("all_gather", shape, str(getattr(tensor, "dtype", None)))
            self._hang_guard.check_call("strategy.all_gather()", identity, debug_only=True)
        return super().all_gather(tensor, group=group, sync_grads=sync_grads)

    def on_run_failure(self, error: BaseException) -> None:
        """The ``Trainer._run`` seam: a fit/validate/test raised on this rank (see :class:`HangGuard.on_failure`)."""
        self._hang_guard.on_failure(error, self._rank())

    def _flush_rank_files(self) -> None:
        if self.rank_metrics_logger is not None:
            self.rank_metrics_logger.flush()

    def _rank(self) -> int:
        return int(self.global_rank)

    def _trainer(self) -> Any:
        """The trainer, or ``None`` (``module.trainer`` raises when unattached: the launching process under spawn)."""
        module = self.lightning_module
        return None if module is None else getattr(module, "_trainer", None)

    def _agree_at_set_up(self) -> tuple[str, list[Any]]:
        """One gather at set-up; then every rank validates what every rank brought, and raises alike.

        Validation comes after the gather so that no rank raises while the others wait in it. Each rank resolving its
        own logger version is a known Lightning bug (#18294, #8945): the ranks adopt rank 0's.
        At world size 1 nothing is exchanged. Returns the run's namespace in the store (rank 0's) and every rank's
        introduction to the stall monitor.
        """
        trainer = self._trainer()
        rank = self._rank()
        mine = {
            "options": (
                self._checkpoint_policy.describe(),
                self._early_stopping_policy.describe(),
                repr(self._per_rank_metrics),
                repr((self._hang_guard.mode, self._hang_guard.uneven_batches, self._hang_guard.check_unsized_loaders)),
                repr(self._hang_guard.stall_options),
            ),
            "invalid": _invalid_policies(self._checkpoint_policy, self._early_stopping_policy, self.world_size),
            "loggers": None if trainer is None else len(_versioned_loggers(trainer)),
            "versions": _logger_versions(trainer) if rank == 0 else None,
            "log_dir": _log_dir(trainer) if rank == 0 and self._per_rank_metrics else None,
            "namespace": f"lightning_ext/{uuid.uuid4().hex}/" if rank == 0 else None,
            "stall": introduction(_log_dir(trainer) if rank == 0 and trainer is not None else None),
        }
        everyone = all_gather_objects(mine, RankGroup.from_strategy(self))
        try:
            _validate_agreement(everyone)
        except Exception as error:  # every rank saw the same data, so every rank raises this
            raise mark_joint(error) from None
        if trainer is not None and everyone[0]["versions"] is not None:
            for logger, version in zip(_versioned_loggers(trainer), everyone[0]["versions"], strict=True):
                logger._version = version
        self._run_log_dir = everyone[0]["log_dir"]
        namespace: str = everyone[0]["namespace"]
        return namespace, [theirs["stall"] for theirs in everyone]


def _validate_agreement(everyone: list[dict[str, Any]]) -> None:
    """Raise the same error on every rank if the ranks' set-up disagrees or is invalid (every rank sees everything)."""
    invalid = [(rank, theirs["invalid"]) for rank, theirs in enumerate(everyone) if theirs["invalid"]]
    if invalid:
        listing = "; ".join(f"rank {rank}: {problem}" for rank, problem in invalid)
        raise ValueError(f"Invalid decision policy: {listing}")
    if any(theirs["options"] != everyone[0]["options"] for theirs in everyone):
        listing = "; ".join(
            f"rank {rank}: checkpoint_policy={theirs['options'][0]}, early_stopping_policy={theirs['options'][1]},"
            f" per_rank_metrics={theirs['options'][2]}, hang checks={theirs['options'][3]}, {theirs['options'][4]}"
            for rank, theirs in enumerate(everyone)
        )
        raise PolicyMismatchError(f"The strategy is configured differently on different ranks: {listing}")
    counts = [theirs["loggers"] for theirs in everyone]
    if len(set(counts)) > 1:
        listing = ", ".join(f"rank {rank}: {count}" for rank, count in enumerate(counts))
        raise PolicyMismatchError(
            f"The ranks configured different numbers of CSV/TensorBoard loggers ({listing}); every rank must configure"
            " the same loggers"
        )


def _invalid_policies(checkpoint: DecisionPolicy, early_stopping: DecisionPolicy, world_size: int) -> str | None:
    """What is wrong with the policies at this world size (checked locally, reported after the gather)."""
    for name, policy in (("checkpoint_policy", checkpoint), ("early_stopping_policy", early_stopping)):
        try:
            policy.validate(world_size)
        except ValueError as error:
            return f"{name}={policy!r}: {error}"
    return None


def _check_base(cls: type) -> None:
    """Raise a ``TypeError`` that names the problem if the mixin cannot work in ``cls``.

    ``cls`` must be a ``ParallelStrategy``, with the mixin before every strategy class in its bases, and its
    ``reduce_boolean_decision`` must take Lightning's calls (``(decision)`` and ``(decision, all=False)``) and let the
    policies swap in each rank's own decision (an instance attribute, as :mod:`lightning_ext._decisions.checkpoint`
    does).
    """
    if not issubclass(cls, ParallelStrategy):
        raise TypeError(
            f"{cls.__qualname__} applies PolicyStrategyMixin to a strategy that is not a ParallelStrategy; the policies"
            " decide across ranks, so the mixin needs a parallel strategy such as DDPStrategy, FSDPStrategy,"
            " ModelParallelStrategy or DeepSpeedStrategy"
        )
    _check_order(cls)
    owner = next(base for base in cls.__mro__ if "reduce_boolean_decision" in base.__dict__)
    if owner is ParallelStrategy:
        return
    problem = _incompatible_decision(owner.__dict__["reduce_boolean_decision"])
    if problem is not None:
        raise TypeError(
            f"{owner.__qualname__}.reduce_boolean_decision {problem}; PolicyStrategyMixin needs one that Lightning's"
            " callbacks can call as reduce_boolean_decision(decision) and reduce_boolean_decision(decision, all=False),"
            " a plain method like ParallelStrategy.reduce_boolean_decision(self, decision: bool, all: bool = True)"
        )


def _check_order(cls: type) -> None:
    """The mixin must come before the strategy in the bases, or its methods (``__init__`` first) never run."""
    mro = cls.__mro__
    if not issubclass(cls, ParallelStrategy) or PolicyStrategyMixin not in mro:
        return
    before = mro[: mro.index(PolicyStrategyMixin)]
    ahead = [base for base in before if issubclass(base, Strategy) and not issubclass(base, PolicyStrategyMixin)]
    if ahead:
        raise TypeError(
            f"{cls.__qualname__} lists {ahead[0].__qualname__} before PolicyStrategyMixin, so the mixin's methods never"
            f" run; put the mixin first: class {cls.__name__}(PolicyStrategyMixin, {ahead[0].__name__})"
        )


def _incompatible_decision(found: object) -> str | None:
    """What keeps an overriding ``reduce_boolean_decision`` from working with the policies, or ``None``."""
    if isinstance(found, (staticmethod, classmethod)):
        function, leading = found.__func__, () if isinstance(found, staticmethod) else (object,)
    elif inspect.isfunction(found):
        function, leading = found, (object,)
    else:
        return f"is a {type(found).__name__}, not a method"
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return "has no signature that can be read"
    try:
        signature.bind(*leading, True)
        signature.bind(*leading, True, all=False)
    except TypeError:
        return f"has the signature {signature}"
    return None


def _versioned_loggers(trainer: Any) -> list[CSVLogger | TensorBoardLogger]:
    """The loggers that pick a ``version_N`` directory on their own (the ones that can disagree across ranks)."""
    return [logger for logger in trainer.loggers if isinstance(logger, (CSVLogger, TensorBoardLogger))]


def _logger_versions(trainer: Any) -> list[int | str | None] | None:
    if trainer is None:
        return None
    return [logger.version for logger in _versioned_loggers(trainer)]


def _log_dir(trainer: Any) -> str:
    """The run's log directory, as ``Trainer.log_dir`` defines it (without its broadcast)."""
    if trainer.loggers:
        first = trainer.loggers[0]
        directory = first.log_dir if isinstance(first, (TensorBoardLogger, CSVLogger)) else first.save_dir
        if directory is not None:
            return str(directory)
    return str(trainer.default_root_dir)
