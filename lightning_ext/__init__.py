"""lightning-ext: cross-rank decision policies and per-rank metrics for PyTorch Lightning under DDP.

Replace ``strategy="ddp"`` with ``PolicyDDPStrategy(checkpoint_policy=..., early_stopping_policy=...)``; your
``ModelCheckpoint`` and ``EarlyStopping`` callbacks stay as they are.
"""

from lightning_ext._runtime import patch_mode
from lightning_ext.diagnostics import count_collectives
from lightning_ext.errors import CrossRankError, LocalDecisionError, MonitorMissingError, PolicyMismatchError
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
    resolve_policy,
)
from lightning_ext.rank_logger import PerRankMetrics, RankCSVLogger
from lightning_ext.rank_metrics import RankMetricsError, RankMetricsWriter, read_rank_metrics
from lightning_ext.strategy import PolicyDDPStrategy

__version__ = "0.1.0.dev0"

__all__ = [
    "AggregatePolicy",
    "AllRanks",
    "AnyRank",
    "CrossRankError",
    "DecisionPolicy",
    "LocalDecisionError",
    "Majority",
    "MonitorMissingError",
    "PerRankMetrics",
    "PolicyDDPStrategy",
    "PolicyMismatchError",
    "Quorum",
    "RankCSVLogger",
    "RankMetricsError",
    "RankMetricsWriter",
    "RankZero",
    "VotePolicy",
    "VoteTally",
    "available_policies",
    "count_collectives",
    "patch_mode",
    "read_rank_metrics",
    "resolve_policy",
]
