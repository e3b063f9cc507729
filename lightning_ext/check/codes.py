"""The check's finding kinds: one stable code each, what happens at run time, the fix; and the message of a finding."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BY_CODE", "KINDS", "Kind", "message"]

_HANGS = "every other rank goes on; stock DDP hangs"


@dataclass(frozen=True)
class Kind:
    """One kind of finding.

    Attributes:
        code: the stable code, as ``# noqa: CODE`` names it.
        name: a short name in words.
        runtime: what happens at run time, after ``"; "`` in the message.
        error: the class lightning-ext's hang checks raise on every rank (``None``: the stall report's case).
        fix: the fix in a few words.

    """

    code: str
    name: str
    runtime: str
    error: str | None
    fix: str


KINDS = (
    Kind(
        "LX101",
        "synced logging under a rank guard",
        f"{_HANGS}, and lightning-ext's checks raise DivergentLoggingError",
        "DivergentLoggingError",
        "log it on every rank, or with rank_zero_only=True",
    ),
    Kind(
        "LX102",
        "a torchmetrics metric logged under a rank guard",
        f"the metric syncs when it is computed; {_HANGS}, and lightning-ext's checks raise DivergentLoggingError",
        "DivergentLoggingError",
        "update and log the metric on every rank (rank_zero_only=True does not stop a metric's sync)",
    ),
    Kind(
        "LX103",
        "synced logging with keys that depend on the rank",
        "each rank syncs a key the others do not; stock DDP syncs the values across different keys, silently mixed,"
        " and lightning-ext's checks raise DivergentLoggingError",
        "DivergentLoggingError",
        "log the same keys on every rank",
    ),
    Kind(
        "LX201",
        "trainer.log_dir under a rank guard",
        f"trainer.log_dir broadcasts from rank 0; {_HANGS}, and lightning-ext's checks raise DivergentCollectiveError",
        "DivergentCollectiveError",
        "read trainer.log_dir on every rank, before the guard",
    ),
    Kind(
        "LX202",
        "trainer.save_checkpoint under a rank guard",
        "trainer.save_checkpoint waits at a barrier (and writes on rank 0 itself);"
        f" {_HANGS}, and lightning-ext's checks raise DivergentCollectiveError",
        "DivergentCollectiveError",
        "call trainer.save_checkpoint on every rank",
    ),
    Kind(
        "LX203",
        "a strategy collective under a rank guard",
        f"{_HANGS}, and lightning-ext's checks raise DivergentCollectiveError",
        "DivergentCollectiveError",
        "call it on every rank, outside the guard, and act on rank 0 afterwards",
    ),
    Kind(
        "LX204",
        "all_gather under a rank guard",
        f"{_HANGS}, and lightning-ext's checks raise DivergentCollectiveError (in training_step and on_train_batch_end"
        ' with hang_checks="debug")',
        "DivergentCollectiveError",
        "gather on every rank, then use the result on rank 0",
    ),
    Kind(
        "LX205",
        "a torch.distributed collective under a rank guard",
        f"{_HANGS}, and lightning-ext's checks raise DivergentCollectiveError (in training_step and on_train_batch_end"
        " its stall report names the rank behind instead)",
        "DivergentCollectiveError",
        "call it on every rank, outside the guard",
    ),
)
BY_CODE = {kind.code: kind for kind in KINDS}


def message(code: str, call: str, where: str) -> str:
    """The message of a finding: the call, where its guard is (``""`` for a rank-dependent key), what happens, the fix.

    Example:
        >>> text = message("LX203", "strategy.barrier()", "under the rank guard on line 11")
        >>> text.split("; ")[0]
        'strategy.barrier() under the rank guard on line 11: every other rank goes on'
        >>> text.split(". ")[1]
        'Fix: call it on every rank, outside the guard, and act on rank 0 afterwards.'

    """
    kind = BY_CODE[code]
    return f"{call}{' ' + where if where else ''}: {kind.runtime}. Fix: {kind.fix}."
