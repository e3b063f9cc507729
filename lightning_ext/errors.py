"""Every exception and warning class of lightning-ext, in one module."""

from typing import Protocol

__all__ = [
    "CheckChannelError",
    "CheckChannelWarning",
    "CrossRankError",
    "DataLoaderSetupError",
    "DecisionRecordError",
    "DecisionRecordWarning",
    "DivergentCollectiveError",
    "DivergentLoggingError",
    "InitModuleWarning",
    "LightningPackageMismatchError",
    "LocalDecisionError",
    "MixedRunsError",
    "MonitorMissingError",
    "PatchError",
    "PolicyMismatchError",
    "RankFailedError",
    "RankMetricsError",
    "RankMetricsWarning",
    "RankSignalledError",
    "SeriesNotApplicableError",
    "StallError",
    "UnevenBatchesError",
    "UnsyncedReadWarning",
]


# ---- raised identically on every rank, so that no rank is left waiting in a collective -----------------------------
class CrossRankError(RuntimeError):
    """Base class: raised with the same message on every rank at the same point of the run.

    Where a rank cannot raise on its own (it is blocked in a collective that the others never join), lightning-ext
    unblocks it and it raises the same error, with the same message.
    """


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


class RankSignalledError(CrossRankError):
    """A rank received SIGTERM or SIGINT (a preemption notice, ``kill``, Ctrl-C) and the others did not."""


class StallError(CrossRankError):
    """The ranks stalled: a rank waited ``stall_timeout`` seconds for the others and no rank made progress, or a rank's
    process is gone. The message names the rank(s) behind, the likely cause, and the stall report's file."""


class DataLoaderSetupError(CrossRankError):
    """A dataloader would fail at its first batch (a generator on another device, ``fit`` inside ``init_module``)."""


class CheckChannelError(CrossRankError):
    """The hang checks' channel could not connect at set-up and the run needs it (``uneven_batches="truncate"``); the
    message names the ranks, their interfaces and addresses, and ``GLOO_SOCKET_IFNAME``."""


class CheckChannelWarning(UserWarning):
    """The hang checks' channel could not connect at set-up: every rank goes on without hang checks (the message says
    where it failed and how to fix it)."""


class UnsyncedReadWarning(UserWarning):
    """A value logged with ``sync_dist=True`` was read inside the hook that logged it, before it synced: this rank's
    own value, where stock Lightning gives the synced one. The first line names the key, the file and line, what stock
    gives there and the fix (read it after the hook, or ``log_sync="per_value"``); warned once per line."""


class InitModuleWarning(UserWarning):
    """A ``trainer.fit`` (``validate``, ...) runs inside ``trainer.init_module()``, which is for the model only."""


# ---- the two Lightning packages -------------------------------------------------------------------------------------
class LightningPackageMismatchError(TypeError):
    """Objects of ``lightning`` and of ``pytorch_lightning`` in one run; the message names both and the fix."""


# ---- the per-rank metrics files --------------------------------------------------------------------------------------
class RankMetricsError(ValueError):
    """A per-rank metrics file is not in the expected format; the message names the file, line and column."""


class MixedRunsError(RankMetricsError):
    """The per-rank files under a log directory come from more than one run; the message names them."""


class RankMetricsWarning(RuntimeWarning):
    """Per-rank metrics stepped aside (a rank stopped writing its file) or a file is incomplete."""


class StragglerWarning(UserWarning):
    """During training, rank 0 found a rank that the other ranks have been waiting for (per-rank telemetry)."""


# ---- the decision record -------------------------------------------------------------------------------------------
class DecisionRecordError(ValueError):
    """A decision record (``decisions.csv``) is malformed or mixes runs; the message names the file and line."""


class DecisionRecordWarning(RuntimeWarning):
    """The decision record stepped aside (rank 0 could not write it) or is incomplete."""


# ---- the patch tool ------------------------------------------------------------------------------------------------
class PatchError(Exception):
    """A series that cannot be checked, applied or reverted as asked; the message (one line) says why."""


class SeriesJudgement(Protocol):
    """What :class:`SeriesNotApplicableError` carries: a :class:`lightning_ext.patches.SeriesReport` (named by its
    methods here, so that this module imports nothing of lightning-ext)."""

    def summary(self) -> str:
        """One line that says where the target stands."""

    def format(self) -> str:
        """The report as text, one line per hunk."""


class SeriesNotApplicableError(PatchError):
    """A hunk fails, or a patch is partly in the target; nothing was written. ``report`` (a
    :class:`lightning_ext.patches.SeriesReport`) says which."""

    def __init__(self, action: str, report: SeriesJudgement) -> None:
        super().__init__(f"refusing to {action}: {report.summary()}; nothing was written")
        self.report = report


# ---- lightning-ext's own bookkeeping -------------------------------------------------------------------------------
_JOINT = "_lightning_ext_joint"


def mark_joint(error: BaseException) -> BaseException:
    """Mark ``error`` as raised by every rank at the same point (so no rank needs to hear of it, or be released)."""
    error.__dict__[_JOINT] = True
    return error


def is_joint(error: BaseException) -> bool:
    """Whether ``error`` was marked by :func:`mark_joint`."""
    return bool(error.__dict__.get(_JOINT, False))
