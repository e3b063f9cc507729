"""lightning-ext: cross-rank decision policies, per-rank metrics and hang checks for PyTorch Lightning.

Importing the package is cheap: each name loads its module on first use, and the strategy names
(``Trainer(strategy="ddp_majority")``) are registered as soon as Lightning itself is imported. The strategies are
``lightning``'s or ``pytorch_lightning``'s, for the package the importing module uses (docs/pytorch-lightning.md).
"""

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from lightning_ext._packages.choice import BOUND_NAMES, Package, module_for, package_for_caller
from lightning_ext.strategies._registry import register_when_lightning_loads

__version__ = "0.1.0.dev0"

_EXPORTS = {
    "AggregatePolicy": "lightning_ext.policies",
    "AllRanks": "lightning_ext.policies",
    "AnyRank": "lightning_ext.policies",
    "CrossRankError": "lightning_ext.errors",
    "DataLoaderSetupError": "lightning_ext.errors",
    "DecisionRecordError": "lightning_ext.errors",
    "DecisionRecordWarning": "lightning_ext.errors",
    "InitModuleWarning": "lightning_ext.errors",
    "DecisionPolicy": "lightning_ext.policies",
    "LightningPackageMismatchError": "lightning_ext.errors",
    "LocalDecisionError": "lightning_ext.errors",
    "Majority": "lightning_ext.policies",
    "MonitorMissingError": "lightning_ext.errors",
    "PerRankMetrics": "lightning_ext.rank_metrics",
    "PolicyDDPStrategy": "lightning_ext.strategies",
    "PolicyDeepSpeedStrategy": "lightning_ext.strategies",
    "PolicyFSDPStrategy": "lightning_ext.strategies",
    "PolicyMismatchError": "lightning_ext.errors",
    "PolicyModelParallelStrategy": "lightning_ext.strategies",
    "PolicyStrategyMixin": "lightning_ext.strategies.mixin",
    "Quorum": "lightning_ext.policies",
    "RankMetricsError": "lightning_ext.errors",
    "RankMetricsWarning": "lightning_ext.errors",
    "RankZero": "lightning_ext.policies",
    "StallError": "lightning_ext.errors",
    "StragglerWarning": "lightning_ext.errors",
    "UnsyncedReadWarning": "lightning_ext.errors",
    "VotePolicy": "lightning_ext.policies",
    "VoteTally": "lightning_ext.policies",
    "available_policies": "lightning_ext.policies",
    "incomplete_ranks": "lightning_ext.rank_metrics",
    "read_decisions": "lightning_ext.decision_record",
    "read_rank_metrics": "lightning_ext.rank_metrics",
}

__all__ = [
    "AggregatePolicy",
    "AllRanks",
    "AnyRank",
    "CrossRankError",
    "DataLoaderSetupError",
    "DecisionPolicy",
    "DecisionRecordError",
    "DecisionRecordWarning",
    "InitModuleWarning",
    "LightningPackageMismatchError",
    "LocalDecisionError",
    "Majority",
    "MonitorMissingError",
    "PerRankMetrics",
    "PolicyDDPStrategy",
    "PolicyDeepSpeedStrategy",
    "PolicyFSDPStrategy",
    "PolicyMismatchError",
    "PolicyModelParallelStrategy",
    "PolicyStrategyMixin",
    "Quorum",
    "RankMetricsError",
    "RankMetricsWarning",
    "RankZero",
    "StallError",
    "StragglerWarning",
    "UnsyncedReadWarning",
    "VotePolicy",
    "VoteTally",
    "available_policies",
    "incomplete_ranks",
    "read_decisions",
    "read_rank_metrics",
]

if importlib.util.find_spec("deepspeed") is None:
    # the name raises an ImportError that says how to install DeepSpeed; left out, `import *` and help() still work
    __all__ = [name for name in __all__ if name != "PolicyDeepSpeedStrategy"]

if TYPE_CHECKING:
    from lightning_ext.decision_record import read_decisions
    from lightning_ext.errors import (
        CrossRankError,
        DataLoaderSetupError,
        DecisionRecordError,
        DecisionRecordWarning,
        InitModuleWarning,
        LightningPackageMismatchError,
        LocalDecisionError,
        MonitorMissingError,
        PolicyMismatchError,
        RankMetricsError,
        RankMetricsWarning,
        StallError,
        StragglerWarning,
        UnsyncedReadWarning,
    )
    from lightning_ext.policies import (
        AggregatePolicy,
        AllRanks,
        AnyRank,
        DecisionPolicy,
        Majority,
        Quorum,
        RankZero,
        VotePolicy,
        VoteTally,
        available_policies,
    )
    from lightning_ext.rank_metrics import (
        PerRankMetrics,
        incomplete_ranks,
        read_rank_metrics,
    )
    from lightning_ext.strategies import (
        PolicyDDPStrategy,
        PolicyDeepSpeedStrategy,
        PolicyFSDPStrategy,
        PolicyModelParallelStrategy,
    )
    from lightning_ext.strategies.mixin import PolicyStrategyMixin


def __getattr__(name: str) -> Any:
    if name in BOUND_NAMES:  # one class per Lightning package: the one the importing module uses, at every lookup
        return _public(name, package_for_caller(sys._getframe(1)))
    value = _public(name, "lightning")  # one object for both packages
    globals()[name] = value  # later lookups skip this function
    return value


def _public(name: str, package: Package) -> Any:
    """The public ``name`` for ``package`` (``lightning_ext.lightning`` and ``lightning_ext.pytorch_lightning``)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_ext' has no attribute {name!r}")
    return getattr(importlib.import_module(module_for(module, package) if name in BOUND_NAMES else module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


register_when_lightning_loads()
