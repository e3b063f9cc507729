"""``PolicyDDPStrategy``: Lightning's ``DDPStrategy`` with the policies, per-rank metrics and hang checks."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from torch.distributed.constants import default_pg_timeout
from typing_extensions import override

from lightning_ext._hang.guard import HangChecks, UnevenMode
from lightning_ext._hang.stall import OnStall
from lightning_ext.policies import PolicyLike
from lightning_ext.rank_metrics import PerRankMetrics
from lightning_ext.strategies._registry import register_policy_names
from lightning_ext.strategies.mixin import PolicyStrategyMixin

__all__ = ["PolicyDDPStrategy"]

_DDP_LAUNCHES = (("ddp", "popen"), ("ddp_spawn", "spawn"), ("ddp_fork", "fork"), ("ddp_notebook", "fork"))
"""Lightning's own DDP names and their start methods (``DDPStrategy.register_strategies``)."""


class PolicyDDPStrategy(PolicyStrategyMixin, DDPStrategy):
    """DDP whose ``ModelCheckpoint``/``EarlyStopping`` decisions follow your policies, with optional per-rank metrics.

    Takes every :class:`~lightning.pytorch.strategies.DDPStrategy` argument, plus the keyword-only options of
    :class:`~lightning_ext.PolicyStrategyMixin`: ``checkpoint_policy`` (default ``"all"``, as stock),
    ``early_stopping_policy`` (default ``"any"``, as stock), ``per_rank_metrics``, and the hang checks
    (``hang_checks``, ``uneven_batches``, ``check_unsized_loaders``), ``decision_record``, ``preemption_policy``, and
    the stall report (``stall_timeout``, ``on_stall``).

    A policy is a name from :func:`~lightning_ext.available_policies` or a :class:`~lightning_ext.DecisionPolicy`
    object such as ``Quorum(2)``. Whatever the policy, every rank ends each decision with the same decision, the same
    checkpoint paths and the same ``trainer.should_stop``. A metric logged on some ranks only raises the same error on
    every rank instead of hanging.

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
        hang_checks: HangChecks = True,
        uneven_batches: UnevenMode = "error",
        check_unsized_loaders: bool = False,
        decision_record: bool = True,
        preemption_policy: PolicyLike | None = "any",
        stall_timeout: float | str | None = "auto",
        on_stall: OnStall = "error",
        **kwargs: Any,
    ) -> None:
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
            checkpoint_policy=checkpoint_policy,
            early_stopping_policy=early_stopping_policy,
            per_rank_metrics=per_rank_metrics,
            hang_checks=hang_checks,
            uneven_batches=uneven_batches,
            check_unsized_loaders=check_unsized_loaders,
            decision_record=decision_record,
            preemption_policy=preemption_policy,
            stall_timeout=stall_timeout,
            on_stall=on_stall,
            **kwargs,
        )

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``"<launch>_policy"`` and ``"<launch>_<policy>"`` for Lightning's four DDP names.

        ``<launch>`` is ``ddp``, ``ddp_spawn``, ``ddp_fork`` or ``ddp_notebook``, with Lightning's start method for
        that name. ``"ddp_<name>"`` uses that policy for both the checkpoint and the early-stopping decision;
        ``"ddp_all"`` is ``all`` for both, unlike ``"ddp_policy"`` (``all`` for checkpoints, ``any`` for stopping, as
        stock).

        """
        for launch, start_method in _DDP_LAUNCHES:
            extra = {} if start_method == "popen" else {"start_method": start_method}
            register_policy_names(strategy_registry, cls, launch, f"DDP (start_method={start_method!r})", **extra)


PolicyDDPStrategy.register_strategies(StrategyRegistry)
