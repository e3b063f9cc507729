"""``PolicyFSDPStrategy``: Lightning's ``FSDPStrategy`` with the policies, per-rank metrics and hang checks."""

from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.strategies import FSDPStrategy, StrategyRegistry
from typing_extensions import override

from lightning_ext.strategies._registry import register_policy_names
from lightning_ext.strategies.mixin import PolicyStrategyMixin

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

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``"fsdp_policy"`` and ``"fsdp_<policy>"``, each checked like ``"fsdp"`` for a GPU accelerator."""
        names = register_policy_names(strategy_registry, cls, "fsdp", "FSDP")
        # the Trainer refuses the names it finds in this list without a GPU, with a clear message, as for "fsdp"
        known = FSDPStrategy._registered_strategies
        known.extend(name for name in names if name not in known)


PolicyFSDPStrategy.register_strategies(StrategyRegistry)
