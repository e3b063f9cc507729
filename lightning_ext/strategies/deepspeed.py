"""``PolicyDeepSpeedStrategy``: DeepSpeed with the policies, per-rank metrics and hang checks (needs DeepSpeed)."""

from lightning.fabric.strategies.deepspeed import _DEEPSPEED_AVAILABLE
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.strategies import DeepSpeedStrategy, StrategyRegistry
from typing_extensions import override

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

    @classmethod
    @override
    def _check_buildable(cls) -> None:
        require_deepspeed()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``"deepspeed_policy"`` and ``"deepspeed_<policy>"``: ZeRO stage 2, like Lightning's ``"deepspeed"``.

        Registered whether or not DeepSpeed is installed, like Lightning's own names: building one without it raises
        the ``ImportError`` of :func:`require_deepspeed`.

        """
        register_policy_names(strategy_registry, cls, "deepspeed", "DeepSpeed (ZeRO stage 2)")


PolicyDeepSpeedStrategy.register_strategies(StrategyRegistry)
