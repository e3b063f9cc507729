"""``PolicyModelParallelStrategy``: Lightning's ``ModelParallelStrategy`` (FSDP2, TP) with the same additions."""

from datetime import timedelta
from typing import Literal

from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.constants import default_pg_timeout

from lightning_ext._hang.guard import HangChecks, UnevenMode
from lightning_ext._hang.stall import OnStall
from lightning_ext.policies import PolicyLike
from lightning_ext.rank_metrics import PerRankMetrics
from lightning_ext.strategies.mixin import PolicyStrategyMixin

__all__ = ["PolicyModelParallelStrategy"]


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
        decision_record: bool = True,
        preemption_policy: PolicyLike | None = "any",
        stall_timeout: float | str | None = "auto",
        on_stall: OnStall = "error",
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
            decision_record=decision_record,
            preemption_policy=preemption_policy,
            stall_timeout=stall_timeout,
            on_stall=on_stall,
        )
