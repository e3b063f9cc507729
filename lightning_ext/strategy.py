"""``PolicyDDPStrategy``: ``DDPStrategy`` with cross-rank decision policies and per-rank metrics files.

The strategy is a thin seam. It carries the options and, once at set-up, agrees with the other ranks on them and on
the run's log directory: one gather, the only collective it adds. Lightning's callbacks and logger connector reach
it through hooks (``save_topk_with_policy``, ``prepare_topk_decision``, ``run_early_stopping_with_policy``,
``loggers_for_log_metrics``; see
:mod:`lightning_ext._runtime`). The hooks delegate to :mod:`lightning_ext.decisions` and
:mod:`lightning_ext.rank_logger`.
"""

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from torch.distributed.constants import default_pg_timeout
from typing_extensions import override

from lightning_ext import _runtime, decisions, local_values
from lightning_ext._collective import RankGroup, all_gather_objects
from lightning_ext.errors import PolicyMismatchError
from lightning_ext.policies import DecisionPolicy, PolicyLike, available_policies, resolve_policy
from lightning_ext.rank_logger import PerRankMetrics, RankCSVLogger, loggers_for

__all__ = ["PolicyDDPStrategy"]


class PolicyDDPStrategy(DDPStrategy):
    """DDP whose ``ModelCheckpoint``/``EarlyStopping`` decisions follow your policies, with optional per-rank metrics.

    Takes every :class:`~lightning.pytorch.strategies.DDPStrategy` argument, plus these keyword-only ones:

    Args:
        checkpoint_policy: how ranks agree to save a new top-k checkpoint. Default ``"all"`` (stock Lightning).
        early_stopping_policy: how ranks agree to stop. Default ``"any"`` (stock Lightning).
        per_rank_metrics: ``True`` (or :class:`~lightning_ext.rank_logger.PerRankMetrics` options) to have every
            rank write its own, un-synced values of every logged row to ``<log_dir>/rank_<r>/metrics.csv``.

    A policy is a name from :func:`~lightning_ext.policies.available_policies` or a
    :class:`~lightning_ext.policies.DecisionPolicy` object such as ``Quorum(2)``. Whatever the policy, every rank
    ends each decision with the same decision, the same checkpoint paths and the same ``trainer.should_stop``. A
    metric logged on some ranks only raises the same error on every rank instead of hanging.

    Example:
        >>> strategy = PolicyDDPStrategy(checkpoint_policy="mean", early_stopping_policy="majority")
        >>> strategy.checkpoint_policy, strategy.early_stopping_policy
        (AggregatePolicy('mean'), Majority())

    """

    strategy_name = "ddp_policy"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        model_averaging_period: int | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        *,
        checkpoint_policy: PolicyLike = "all",
        early_stopping_policy: PolicyLike = "any",
        per_rank_metrics: bool | PerRankMetrics = False,
        **kwargs: Any,
    ) -> None:
        _runtime.install()
        if not _runtime.seams_available():
            raise RuntimeError(
                "lightning-ext cannot reach Lightning's callbacks: the installed Lightning is not patched and runtime"
                " patching is switched off (LIGHTNING_EXT_RUNTIME_PATCHING=0). Apply the seams with"
                " `python -m lightning_ext.patches apply`, or unset the variable."
            )
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            ddp_comm_state=ddp_comm_state,
            ddp_comm_hook=ddp_comm_hook,
            ddp_comm_wrapper=ddp_comm_wrapper,
            model_averaging_period=model_averaging_period,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **kwargs,
        )
        self._checkpoint_policy = resolve_policy(checkpoint_policy)
        self._early_stopping_policy = resolve_policy(early_stopping_policy)
        if not isinstance(per_rank_metrics, (bool, PerRankMetrics)):
            raise TypeError(f"per_rank_metrics must be a bool or PerRankMetrics, got {type(per_rank_metrics).__name__}")
        self._per_rank_metrics = PerRankMetrics() if per_rank_metrics is True else (per_rank_metrics or None)
        self._run_log_dir: str | None = None
        self.rank_metrics_logger: RankCSVLogger | None = None

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

    @override
    def setup_environment(self) -> None:
        _runtime.install()  # a spawned or re-launched process imports us afresh
        super().setup_environment()
        self._agree_at_set_up()

    @override
    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        if self._per_rank_metrics is None or self._run_log_dir is None:
            return
        self.rank_metrics_logger = RankCSVLogger(self._run_log_dir, self.global_rank, self._per_rank_metrics)
        local_values.start_capture(self.global_rank)
        if trainer.loggers:  # a member for the run, so it also gets what callbacks send to every logger
            trainer.loggers = [*trainer.loggers, self.rank_metrics_logger]

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if self.rank_metrics_logger is not None and trainer is not None and trainer.ckpt_path is not None:
            # resumed: rows after the checkpoint's step will be logged again, so the writer drops them from the file
            self.rank_metrics_logger.resume_from_step = trainer.fit_loop.epoch_loop._batches_that_stepped

    @override
    def teardown(self) -> None:
        rank_logger, self.rank_metrics_logger = self.rank_metrics_logger, None
        if rank_logger is not None:
            local_values.stop_capture()
            rank_logger.close()
            trainer = self.lightning_module.trainer if self.lightning_module is not None else None
            if trainer is not None and rank_logger in trainer.loggers:
                trainer.loggers = [logger for logger in trainer.loggers if logger is not rank_logger]
        super().teardown()

    def save_topk_with_policy(self, callback: Any, trainer: Any, monitor_candidates: dict[str, Any]) -> bool:
        """The ``ModelCheckpoint`` seam: decide the top-k save under :attr:`checkpoint_policy`."""
        return decisions.save_topk_checkpoint(callback, trainer, monitor_candidates)

    def prepare_topk_decision(self, callback: Any, trainer: Any, monitor_candidates: dict[str, Any]) -> None:
        """The ``ModelCheckpoint.on_train_batch_end`` seam: decide a due step-based save on every rank, up front."""
        decisions.prepare_topk_decision(callback, trainer, monitor_candidates)

    def run_early_stopping_with_policy(self, callback: Any, trainer: Any) -> bool:
        """The ``EarlyStopping`` seam: decide the stop under :attr:`early_stopping_policy`."""
        return decisions.run_early_stopping_check(callback, trainer)

    def loggers_for_log_metrics(self, trainer: Any, metrics: dict[str, Any]) -> list[Logger]:
        """The logger connector's seam: the loggers one row goes to (with this rank's per-rank logger)."""
        return loggers_for(trainer, metrics)

    def _agree_at_set_up(self) -> None:
        """One gather at set-up: the same options everywhere, and rank 0's log directory and logger versions.

        Each rank resolving its own logger version is a known Lightning bug (#18294, #8945): the ranks adopt rank 0's.
        At world size 1 nothing is exchanged.
        """
        for policy in (self._checkpoint_policy, self._early_stopping_policy):
            policy.validate(self.world_size)
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        mine = {
            "options": (
                self._checkpoint_policy.describe(),
                self._early_stopping_policy.describe(),
                repr(self._per_rank_metrics),
            ),
            "versions": _logger_versions(trainer) if self.global_rank == 0 else None,
            "log_dir": _log_dir(trainer) if self.global_rank == 0 and self._per_rank_metrics else None,
        }
        everyone = all_gather_objects(mine, RankGroup.from_strategy(self))
        if any(theirs["options"] != mine["options"] for theirs in everyone):
            listing = "; ".join(
                f"rank {rank}: checkpoint_policy={theirs['options'][0]}, early_stopping_policy={theirs['options'][1]},"
                f" per_rank_metrics={theirs['options'][2]}"
                for rank, theirs in enumerate(everyone)
            )
            raise PolicyMismatchError(f"PolicyDDPStrategy is configured differently on different ranks: {listing}")
        if trainer is not None and everyone[0]["versions"] is not None:
            _adopt_logger_versions(trainer, everyone[0]["versions"])
        self._run_log_dir = everyone[0]["log_dir"]

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``"ddp_policy"`` (stock rules) and ``"ddp_<policy>"`` for each built-in policy name.

        ``"ddp_<name>"`` uses that policy for both the checkpoint and the early-stopping decision; ``"ddp_all"`` is
        ``all`` for both, unlike ``"ddp_policy"`` (``all`` for checkpoints, ``any`` for stopping, as stock).

        """
        entries: dict[str, dict[str, Any]] = {cls.strategy_name: {}}
        for name in available_policies():
            entries[f"ddp_{name}"] = {"checkpoint_policy": name, "early_stopping_policy": name}
        for name, init_params in entries.items():
            if name in strategy_registry:
                continue
            rules = init_params or {"checkpoint_policy": "all", "early_stopping_policy": "any"}
            strategy_registry.register(
                name,
                cls,
                description=(
                    f"DDP with checkpoint_policy={rules['checkpoint_policy']!r} and"
                    f" early_stopping_policy={rules['early_stopping_policy']!r} (lightning-ext)"
                ),
                **init_params,
            )


def _versioned_loggers(trainer: Any) -> list[CSVLogger | TensorBoardLogger]:
    """The loggers that pick a ``version_N`` directory on their own (the ones that can disagree across ranks)."""
    return [logger for logger in trainer.loggers if isinstance(logger, (CSVLogger, TensorBoardLogger))]


def _logger_versions(trainer: Any) -> list[int | str | None] | None:
    if trainer is None:
        return None
    return [logger.version for logger in _versioned_loggers(trainer)]


def _adopt_logger_versions(trainer: Any, versions: list[int | str | None]) -> None:
    loggers = _versioned_loggers(trainer)
    if len(loggers) != len(versions):
        raise PolicyMismatchError(
            f"Rank 0 has {len(versions)} CSV/TensorBoard logger(s) and this rank has {len(loggers)}: every rank must"
            " configure the same loggers"
        )
    for logger, version in zip(loggers, versions, strict=True):
        logger._version = version


def _log_dir(trainer: Any) -> str:
    """The run's log directory, as ``Trainer.log_dir`` defines it (without its broadcast)."""
    if trainer.loggers:
        first = trainer.loggers[0]
        directory = first.log_dir if isinstance(first, (TensorBoardLogger, CSVLogger)) else first.save_dir
        if directory is not None:
            return str(directory)
    return str(trainer.default_root_dir)


PolicyDDPStrategy.register_strategies(StrategyRegistry)
