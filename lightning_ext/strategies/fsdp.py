"""``PolicyFSDPStrategy``: Lightning's ``FSDPStrategy`` with the policies, per-rank metrics and hang checks."""

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import FSDPStrategy, StrategyRegistry
from torch.distributed.constants import default_pg_timeout
from torch.nn import Module
from typing_extensions import override

from lightning_ext._hang.guard import HangChecks, UnevenMode
from lightning_ext._hang.stall import OnStall
from lightning_ext.policies import PolicyLike
from lightning_ext.rank_metrics import PerRankMetrics
from lightning_ext.strategies._registry import register_policy_names
from lightning_ext.strategies.mixin import PolicyStrategyMixin

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    _POLICY = set[type[Module]] | Callable[[Module, bool, int], bool] | ModuleWrapPolicy
    _SHARDING_STRATEGY = ShardingStrategy | Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]

__all__ = ["PolicyFSDPStrategy"]


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
            decision_record=decision_record,
            preemption_policy=preemption_policy,
            stall_timeout=stall_timeout,
            on_stall=on_stall,
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


PolicyFSDPStrategy.register_strategies(StrategyRegistry)
