"""``PolicyDeepSpeedStrategy``: DeepSpeed with the policies, per-rank metrics and hang checks (needs DeepSpeed)."""

import logging
from datetime import timedelta
from typing import Any

import torch
from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.strategies.deepspeed import _DEEPSPEED_AVAILABLE
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DeepSpeedStrategy, StrategyRegistry
from torch.distributed.constants import default_pg_timeout
from typing_extensions import override

from lightning_ext._hang.guard import HangChecks, UnevenMode
from lightning_ext._hang.stall import OnStall
from lightning_ext.policies import PolicyLike
from lightning_ext.rank_metrics import PerRankMetrics
from lightning_ext.strategies._registry import register_policy_names
from lightning_ext.strategies.mixin import PolicyStrategyMixin

__all__ = ["PolicyDeepSpeedStrategy", "require_deepspeed"]


def require_deepspeed() -> None:
    """Raise an ``ImportError`` that says how to install DeepSpeed, unless it is installed."""
    if not _DEEPSPEED_AVAILABLE:
        raise ImportError(
            "PolicyDeepSpeedStrategy needs the `deepspeed` package, which is not installed."
            " Install it with `pip install deepspeed` (see https://www.deepspeed.ai/getting-started/)."
        )


class PolicyDeepSpeedStrategy(PolicyStrategyMixin, DeepSpeedStrategy):
    """DeepSpeed whose ``ModelCheckpoint``/``EarlyStopping`` decisions follow your policies, with per-rank metrics.

    Takes every :class:`~lightning.pytorch.strategies.DeepSpeedStrategy` argument, plus the keyword-only options of
    :class:`~lightning_ext.PolicyStrategyMixin`. Needs the ``deepspeed`` package (``pip install deepspeed``).

    Raises:
        ImportError: DeepSpeed is not installed.

    """

    strategy_name = "deepspeed_policy"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        zero_optimization: bool = True,
        stage: int = 2,
        remote_device: str | None = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        offload_params_device: str = "cpu",
        nvme_path: str = "/local_nvme",
        params_buffer_count: int = 5,
        params_buffer_size: int = 100_000_000,
        max_in_cpu: int = 1_000_000_000,
        offload_optimizer_device: str = "cpu",
        optimizer_buffer_count: int = 4,
        block_size: int = 1048576,
        queue_depth: int = 8,
        single_submit: bool = False,
        overlap_events: bool = True,
        thread_count: int = 1,
        pin_memory: bool = False,
        sub_group_size: int = 1_000_000_000_000,
        contiguous_gradients: bool = True,
        overlap_comm: bool = True,
        allgather_partitions: bool = True,
        reduce_scatter: bool = True,
        allgather_bucket_size: int = 200_000_000,
        reduce_bucket_size: int = 200_000_000,
        zero_allow_untested_optimizer: bool = True,
        logging_batch_size_per_gpu: str | int = "auto",
        config: _PATH | dict[str, Any] | None = None,
        logging_level: int = logging.WARN,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        loss_scale: float = 0,
        initial_scale_power: int = 16,
        loss_scale_window: int = 1000,
        hysteresis: int = 2,
        min_loss_scale: int = 1,
        partition_activations: bool = False,
        cpu_checkpointing: bool = False,
        contiguous_memory_optimization: bool = False,
        synchronize_checkpoint_boundary: bool = False,
        load_full_weights: bool = False,
        precision_plugin: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        exclude_frozen_parameters: bool = False,
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
    ) -> None:
        require_deepspeed()
        super().__init__(
            accelerator=accelerator,
            zero_optimization=zero_optimization,
            stage=stage,
            remote_device=remote_device,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            offload_params_device=offload_params_device,
            nvme_path=nvme_path,
            params_buffer_count=params_buffer_count,
            params_buffer_size=params_buffer_size,
            max_in_cpu=max_in_cpu,
            offload_optimizer_device=offload_optimizer_device,
            optimizer_buffer_count=optimizer_buffer_count,
            block_size=block_size,
            queue_depth=queue_depth,
            single_submit=single_submit,
            overlap_events=overlap_events,
            thread_count=thread_count,
            pin_memory=pin_memory,
            sub_group_size=sub_group_size,
            contiguous_gradients=contiguous_gradients,
            overlap_comm=overlap_comm,
            allgather_partitions=allgather_partitions,
            reduce_scatter=reduce_scatter,
            allgather_bucket_size=allgather_bucket_size,
            reduce_bucket_size=reduce_bucket_size,
            zero_allow_untested_optimizer=zero_allow_untested_optimizer,
            logging_batch_size_per_gpu=logging_batch_size_per_gpu,
            config=config,
            logging_level=logging_level,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            loss_scale=loss_scale,
            initial_scale_power=initial_scale_power,
            loss_scale_window=loss_scale_window,
            hysteresis=hysteresis,
            min_loss_scale=min_loss_scale,
            partition_activations=partition_activations,
            cpu_checkpointing=cpu_checkpointing,
            contiguous_memory_optimization=contiguous_memory_optimization,
            synchronize_checkpoint_boundary=synchronize_checkpoint_boundary,
            load_full_weights=load_full_weights,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            exclude_frozen_parameters=exclude_frozen_parameters,
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
        )

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``"deepspeed_policy"`` and ``"deepspeed_<policy>"``: ZeRO stage 2, like Lightning's ``"deepspeed"``.

        Registered whether or not DeepSpeed is installed, like Lightning's own names: building one without it raises
        the ``ImportError`` of :func:`require_deepspeed`.

        """
        register_policy_names(strategy_registry, cls, "deepspeed", "DeepSpeed (ZeRO stage 2)")


PolicyDeepSpeedStrategy.register_strategies(StrategyRegistry)
