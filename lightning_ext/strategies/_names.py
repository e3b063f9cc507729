"""The strategy registry's names for our strategies: ``"<Lightning's name>_<policy>"`` and ``"<...>_policy"``.

One scheme for every strategy family, so that a name says which Lightning strategy it extends and which policy it
applies: ``"ddp_notebook_majority"`` is Lightning's ``"ddp_notebook"`` with the ``majority`` policy for both decisions.
"""

from typing import Any

from lightning.fabric.strategies.registry import _StrategyRegistry

from lightning_ext.policies import available_policies

__all__ = ["policy_names", "register_policy_names"]

_STOCK_RULES = ("all", "any")  # what "<family>_policy" stands for: the class defaults, stock Lightning's rules


def policy_names(family: str) -> dict[str, tuple[str, str]]:
    """Every name of a family, with its ``(checkpoint_policy, early_stopping_policy)``.

    Example:
        >>> names = policy_names("fsdp")
        >>> names["fsdp_policy"], names["fsdp_majority"]
        (('all', 'any'), ('majority', 'majority'))
        >>> len(names)
        8

    """
    names = {f"{family}_policy": _STOCK_RULES}
    names.update({f"{family}_{name}": (name, name) for name in available_policies()})
    return names


def register_policy_names(
    strategy_registry: _StrategyRegistry, strategy: type, family: str, what: str, **init_params: Any
) -> list[str]:
    """Register every name of :func:`policy_names` that is not registered yet (so calling it twice is harmless).

    Args:
        strategy_registry: Lightning's registry.
        strategy: the strategy class the names build.
        family: the names' prefix, Lightning's own name for the base strategy (``"ddp_spawn"``).
        what: the base strategy in words, for the registry's descriptions.
        init_params: the base strategy's arguments that the family stands for (``start_method="spawn"``).

    Returns:
        Every name of the family, registered now or before.

    """
    names = policy_names(family)
    for name, (checkpoint, stopping) in names.items():
        if name in strategy_registry:
            continue
        strategy_registry.register(
            name,
            strategy,
            description=(
                f"{what} with checkpoint_policy={checkpoint!r} and early_stopping_policy={stopping!r} (lightning-ext)"
            ),
            checkpoint_policy=checkpoint,
            early_stopping_policy=stopping,
            **init_params,
        )
    return list(names)
