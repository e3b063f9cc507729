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
# nor torch. A name loads its module on first use, relative to this package's own name: compiled again for
# pytorch_lightning (lightning_ext.pytorch_lightning.strategies), it loads the modules compiled for it.
_EXPORTS = {
    "PolicyDDPStrategy": ".ddp",
    "PolicyDeepSpeedStrategy": ".deepspeed",
    "PolicyFSDPStrategy": ".fsdp",
    "PolicyModelParallelStrategy": ".model_parallel",
    "PolicyStrategyMixin": ".mixin",
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
    loaded = importlib.import_module(module, __name__)
    if name == "PolicyDeepSpeedStrategy":  # importable only where DeepSpeed is installed
        loaded.require_deepspeed()
    return getattr(loaded, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
