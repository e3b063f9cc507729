"""The strategy names in Lightning's registry (``"ddp_<policy>"``, ...), registered once Lightning is imported."""

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lightning_ext._packages.choice import TRIGGERS, Package, module_for
from lightning_ext.policies import available_policies

if TYPE_CHECKING:
    from lightning.fabric.strategies.registry import _StrategyRegistry

__all__ = ["policy_names", "register_policy_names", "register_when_lightning_loads"]

# importing each registers its names: every module ends by calling its class's register_strategies
_STRATEGIES = ("lightning_ext.strategies.ddp", "lightning_ext.strategies.fsdp", "lightning_ext.strategies.deepspeed")


def register_when_lightning_loads() -> None:
    """For each Lightning package (``lightning``, ``pytorch_lightning``): register now if it is loaded, else once it
    is (idempotent). Importing one package never imports the other."""
    for package, trigger in TRIGGERS.items():
        if trigger in sys.modules:
            _register(package)
        elif not any(isinstance(finder, _AfterImport) and finder.name == trigger for finder in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(trigger, functools.partial(_register, package)))


_STOCK_RULES = ("all", "any")  # what "<family>_policy" stands for: the class defaults, stock Lightning's rules
_QUORUM_NAMES = ("quorum_50", "quorum_75", "quorum_90")  # fractions of the ranks, so a name works at any world size


def policy_names(family: str) -> dict[str, tuple[str, str]]:
    """Every name of a family, with its ``(checkpoint_policy, early_stopping_policy)``.

    Example:
        >>> names = policy_names("fsdp")
        >>> names["fsdp_policy"], names["fsdp_majority"], names["fsdp_quorum_75"]
        (('all', 'any'), ('majority', 'majority'), ('quorum_75', 'quorum_75'))
        >>> len(names)
        11

    """
    names = {f"{family}_policy": _STOCK_RULES}
    names.update({f"{family}_{name}": (name, name) for name in [*available_policies(), *_QUORUM_NAMES]})
    return names


def register_policy_names(
    strategy_registry: "_StrategyRegistry", strategy: type, family: str, what: str, **init_params: Any
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


def _register(package: Package) -> None:
    """Register ``package``'s names, and let its Trainer name a strategy of the other package (``_runtime``)."""
    try:
        for module in _STRATEGIES:
            importlib.import_module(module_for(module, package))
        importlib.import_module(module_for("lightning_ext.strategies._runtime", package)).check_trainer_strategies()
    except Exception as error:  # guards the user's `import lightning` (this runs inside it) from our names' set-up.
        # Nothing narrower: importing our modules and checking the Trainer's strategies against a Lightning release we
        # may not know can fail in any way, and no failure of ours may break that import; it warns instead
        warnings.warn(
            f"lightning-ext could not set up its strategy names for {package}: {error!r}", RuntimeWarning, stacklevel=2
        )


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``name`` is imported, lets the other finders load it, then calls ``callback``."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self._callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot, and out of the way of the search below
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        for finder in sys.meta_path:
            if spec is not None:
                break
            spec = finder.find_spec(fullname, path, target)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module
        callback = self._callback

        def exec_then_register(module: ModuleType) -> None:
            execute(module)
            callback()

        loader.exec_module = exec_then_register  # type: ignore[method-assign]  # this load's loader only
        return spec
