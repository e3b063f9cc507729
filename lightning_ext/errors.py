"""Errors that lightning-ext raises identically on every rank, so that no rank is left waiting in a collective.

Every one subclasses :class:`CrossRankError`. Where a rank cannot raise on its own (it is blocked in a collective that
the others never join), lightning-ext unblocks it and it raises the same error, with the same message.
"""

__all__ = [
    "CrossRankError",
    "DivergentCollectiveError",
    "DivergentLoggingError",
    "LocalDecisionError",
    "MonitorMissingError",
    "PolicyMismatchError",
    "RankFailedError",
    "UnevenBatchesError",
]


class CrossRankError(RuntimeError):
    """Base class: raised with the same message on every rank at the same point of the run."""


class MonitorMissingError(CrossRankError):
    """The monitored metric was logged on some ranks but not on others."""


class LocalDecisionError(CrossRankError):
    """At least one rank could not make its own part of a decision (it raised, or returned something unusable)."""


class PolicyMismatchError(CrossRankError):
    """The ranks were configured differently (decision policies, options, loggers)."""


class UnevenBatchesError(CrossRankError):
    """The ranks would run different numbers of batches in an epoch; the message names the dataloader and counts."""


class DivergentLoggingError(CrossRankError):
    """A synced ``self.log`` (or a logged torchmetrics metric) was logged on some ranks only, or with other keys."""


class DivergentCollectiveError(CrossRankError):
    """A collective call (``barrier``, ``broadcast``, ``trainer.log_dir``, ...) was made on some ranks only."""


class RankFailedError(CrossRankError):
    """Another rank raised; its error and traceback are in the message."""
