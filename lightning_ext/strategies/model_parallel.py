"""``PolicyModelParallelStrategy``: Lightning's ``ModelParallelStrategy`` (FSDP2, TP) with the same additions."""

from lightning.pytorch.strategies import ModelParallelStrategy

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
