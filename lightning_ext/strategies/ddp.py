"""``PolicyDDPStrategy``: Lightning's ``DDPStrategy`` with the policies, per-rank metrics and hang checks."""

from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from typing_extensions import override

from lightning_ext.strategies._registry import register_policy_names
from lightning_ext.strategies.mixin import PolicyStrategyMixin

__all__ = ["PolicyDDPStrategy"]

_DDP_LAUNCHES = (("ddp", "popen"), ("ddp_spawn", "spawn"), ("ddp_fork", "fork"), ("ddp_notebook", "fork"))
"""Lightning's own DDP names and their start methods (``DDPStrategy.register_strategies``)."""


class PolicyDDPStrategy(PolicyStrategyMixin, DDPStrategy):
    """DDP whose ``ModelCheckpoint``/``EarlyStopping`` decisions follow your policies, with optional per-rank metrics.

    Takes every :class:`~lightning.pytorch.strategies.DDPStrategy` argument, plus the keyword-only options of
    :class:`~lightning_ext.PolicyStrategyMixin` (listed there; their defaults decide as stock Lightning does).

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
