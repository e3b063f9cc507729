"""Lightning's parallel strategies with cross-rank decision policies, per-rank metrics and hang checks."""

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__all__ = [
    "PolicyDDPStrategy",
    "PolicyDeepSpeedStrategy",
    "PolicyFSDPStrategy",
    "PolicyModelParallelStrategy",
    "PolicyStrategyMixin",
]

# Lazy, as the package itself: `import lightning_ext` imports this package's _registry, and must load neither Lightning
# nor torch. A name loads its module on first use.
_EXPORTS = {
    "PolicyDDPStrategy": "lightning_ext.strategies.ddp",
    "PolicyDeepSpeedStrategy": "lightning_ext.strategies.deepspeed",
    "PolicyFSDPStrategy": "lightning_ext.strategies.fsdp",
    "PolicyModelParallelStrategy": "lightning_ext.strategies.model_parallel",
    "PolicyStrategyMixin": "lightning_ext.strategies.mixin",
}

if importlib.util.find_spec("deepspeed") is None:  # the name raises an ImportError that says how to install DeepSpeed
    __all__ = [name for name in __all__ if name != "PolicyDeepSpeedStrategy"]

if TYPE_CHECKING:
    from lightning_ext.strategies.ddp import PolicyDDPStrategy
    from lightning_ext.strategies.deepspeed import PolicyDeepSpeedStrategy
    from lightning_ext.strategies.fsdp import PolicyFSDPStrategy
    from lightning_ext.strategies.mixin import PolicyStrategyMixin
    from lightning_ext.strategies.model_parallel import PolicyModelParallelStrategy


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(module)
    if name == "PolicyDeepSpeedStrategy":  # importable only where DeepSpeed is installed
        loaded.require_deepspeed()
    return getattr(loaded, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
