"""Errors that lightning-ext raises identically on every rank, so that no rank is left waiting in a collective."""

__all__ = ["CrossRankError", "LocalDecisionError", "MonitorMissingError", "PolicyMismatchError"]


class CrossRankError(RuntimeError):
    """Base class: raised with the same message on every rank at the same point of the run."""


class MonitorMissingError(CrossRankError):
    """The monitored metric was logged on some ranks but not on others."""


class LocalDecisionError(CrossRankError):
    """At least one rank could not make its own part of a decision (it raised, or returned something unusable)."""


class PolicyMismatchError(CrossRankError):
    """The ranks were configured with different decision policies."""
