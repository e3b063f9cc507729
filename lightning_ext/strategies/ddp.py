"""Lightning's parallel strategies with cross-rank decision policies and per-rank metrics, ready to use.

Each class is a Lightning strategy with :class:`~lightning_ext.PolicyStrategyMixin` in front: it takes every argument
of its base class (same names, order and defaults), plus the mixin's keyword-only options. Importing this module
registers their names in Lightning's strategy registry, ``<Lightning's name>_<policy>`` (``Trainer(strategy=
"ddp_majority")``, ``"ddp_notebook_mean"``, ``"fsdp_any"``) and ``<Lightning's name>_policy`` (stock rules):

========================= ============================== ============================================
Lightning's name          ours                           class and arguments
========================= ============================== ============================================
``ddp``                   ``ddp_<policy>``               ``PolicyDDPStrategy``
``ddp_spawn``             ``ddp_spawn_<policy>``         ``PolicyDDPStrategy(start_method="spawn")``
``ddp_fork``              ``ddp_fork_<policy>``          ``PolicyDDPStrategy(start_method="fork")``
``ddp_notebook``          ``ddp_notebook_<policy>``      ``PolicyDDPStrategy(start_method="fork")``
``fsdp``                  ``fsdp_<policy>``              ``PolicyFSDPStrategy``
``deepspeed``             ``deepspeed_<policy>``         ``PolicyDeepSpeedStrategy`` (ZeRO stage 2)
========================= ============================== ============================================

``<policy>`` is one of :func:`~lightning_ext.available_policies`, used for both decisions. Lightning registers no name
for ``ModelParallelStrategy``, nor do we: pass ``PolicyModelParallelStrategy(...)``. Other variants (FSDP's CPU
offload, DeepSpeed's stage 3) are arguments of the class. ``PolicyDeepSpeedStrategy`` needs the ``deepspeed`` package:
without it, importing the name or building a ``deepspeed_<policy>`` strategy raises an ``ImportError`` that says how to
install it.
"""

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.strategies.deepspeed import _DEEPSPEED_AVAILABLE
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy, StrategyRegistry
from torch.distributed.constants import default_pg_timeout
from torch.nn import Module
from typing_extensions import override

from lightning_ext._hang.guard import HangChecks, UnevenMode
from lightning_ext.policies import PolicyLike
from lightning_ext.rank_metrics import PerRankMetrics
from lightning_ext.strategies import deepspeed as _deepspeed
from lightning_ext.strategies._names import register_policy_names
from lightning_ext.strategies.mixin import PolicyStrategyMixin

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from lightning_ext.strategies.deepspeed import PolicyDeepSpeedStrategy

    _POLICY = set[type[Module]] | Callable[[Module, bool, int], bool] | ModuleWrapPolicy
    _SHARDING_STRATEGY = ShardingStrategy | Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]

__all__ = ["PolicyDDPStrategy", "PolicyDeepSpeedStrategy", "PolicyFSDPStrategy", "PolicyModelParallelStrategy"]
if not _DEEPSPEED_AVAILABLE:  # the name raises an ImportError that says how to install DeepSpeed (see __getattr__)
    __all__ = [name for name in __all__ if name != "PolicyDeepSpeedStrategy"]

_DDP_LAUNCHES = (("ddp", "popen"), ("ddp_spawn", "spawn"), ("ddp_fork", "fork"), ("ddp_notebook", "fork"))
"""Lightning's own DDP names and their start methods (``DDPStrategy.register_strategies``)."""


class PolicyDDPStrategy(PolicyStrategyMixin, DDPStrategy):
    """DDP whose ``ModelCheckpoint``/``EarlyStopping`` decisions follow your policies, with optional per-rank metrics.

    Takes every :class:`~lightning.pytorch.strategies.DDPStrategy` argument, plus the keyword-only options of
    :class:`~lightning_ext.PolicyStrategyMixin`: ``checkpoint_policy`` (default ``"all"``, as stock),
    ``early_stopping_policy`` (default ``"any"``, as stock), ``per_rank_metrics``, and the hang checks
    (``hang_checks``, ``uneven_batches``, ``check_unsized_loaders``).

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


class PolicyFSDPStrategy(PolicyStrategyMixin, FSDPStrategy):
    """FSDP whose ``ModelCheckpoint``/``EarlyStopping`` decisions follow your policies, with optional per-rank metrics.

    Takes every :class:`~lightning.pytorch.strategies.FSDPStrategy` argument, plus the keyword-only options of
    :class:`~lightning_ext.PolicyStrategyMixin`. Like Lightning's FSDP, it needs CUDA devices.

    Example:
        >>> strategy = PolicyFSDPStrategy(sharding_strategy="SHARD_GRAD_OP", checkpoint_policy="majority")
        >>> strategy.checkpoint_policy, strategy.early_stopping_policy
        (Majority(), AnyRank())

    """

    strategy_name = "fsdp_policy"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        cpu_offload: "bool | CPUOffload | None" = None,
        mixed_precision: "MixedPrecision | None" = None,
        auto_wrap_policy: "_POLICY | None" = None,
        activation_checkpointing: type[Module] | list[type[Module]] | None = None,
        activation_checkpointing_policy: "_POLICY | None" = None,
        sharding_strategy: "_SHARDING_STRATEGY" = "FULL_SHARD",
        state_dict_type: Literal["full", "sharded"] = "full",
        device_mesh: "tuple[int, int] | DeviceMesh | None" = None,
        *,
        checkpoint_policy: PolicyLike = "all",
        early_stopping_policy: PolicyLike = "any",
        per_rank_metrics: bool | PerRankMetrics = False,
        hang_checks: HangChecks = True,
        uneven_batches: UnevenMode = "error",
        check_unsized_loaders: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            cpu_offload=cpu_offload,
            mixed_precision=mixed_precision,
            auto_wrap_policy=auto_wrap_policy,
            activation_checkpointing=activation_checkpointing,
            activation_checkpointing_policy=activation_checkpointing_policy,
            sharding_strategy=sharding_strategy,
            state_dict_type=state_dict_type,
            device_mesh=device_mesh,
            checkpoint_policy=checkpoint_policy,
            early_stopping_policy=early_stopping_policy,
            per_rank_metrics=per_rank_metrics,
            hang_checks=hang_checks,
            uneven_batches=uneven_batches,
            check_unsized_loaders=check_unsized_loaders,
            **kwargs,
        )

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``"fsdp_policy"`` and ``"fsdp_<policy>"``, each checked like ``"fsdp"`` for a GPU accelerator."""
        names = register_policy_names(strategy_registry, cls, "fsdp", "FSDP")
        # the Trainer refuses the names it finds in this list without a GPU, with a clear message, as for "fsdp"
        known = FSDPStrategy._registered_strategies
        known.extend(name for name in names if name not in known)


class PolicyModelParallelStrategy(PolicyStrategyMixin, ModelParallelStrategy):
    """ModelParallel (FSDP2 and tensor parallelism) whose checkpoint and stopping decisions follow your policies.

    Takes every :class:`~lightning.pytorch.strategies.ModelParallelStrategy` argument, plus the keyword-only options of
    :class:`~lightning_ext.PolicyStrategyMixin`. Lightning registers no name for this strategy; neither do we.
    With ``save_distributed_checkpoint=True`` (the default) a checkpoint is a directory that every rank writes its
    shard into; its name, ``best_model_path`` and ``last_model_path`` are the same on every rank.

    Example:
        >>> strategy = PolicyModelParallelStrategy(data_parallel_size=2, checkpoint_policy="min")
        >>> strategy.checkpoint_policy
        AggregatePolicy('min')

    """

    def __init__(
        self,
        data_parallel_size: Literal["auto"] | int = "auto",
        tensor_parallel_size: Literal["auto"] | int = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        *,
        checkpoint_policy: PolicyLike = "all",
        early_stopping_policy: PolicyLike = "any",
        per_rank_metrics: bool | PerRankMetrics = False,
        hang_checks: HangChecks = True,
        uneven_batches: UnevenMode = "error",
        check_unsized_loaders: bool = False,
    ) -> None:
        super().__init__(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
            checkpoint_policy=checkpoint_policy,
            early_stopping_policy=early_stopping_policy,
            per_rank_metrics=per_rank_metrics,
            hang_checks=hang_checks,
            uneven_batches=uneven_batches,
            check_unsized_loaders=check_unsized_loaders,
        )


def __getattr__(name: str) -> Any:
    if name == "PolicyDeepSpeedStrategy":  # importable only where DeepSpeed is installed
        _deepspeed.require_deepspeed()
        return _deepspeed.PolicyDeepSpeedStrategy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PolicyDDPStrategy.register_strategies(StrategyRegistry)
PolicyFSDPStrategy.register_strategies(StrategyRegistry)
_deepspeed.PolicyDeepSpeedStrategy.register_strategies(StrategyRegistry)
