"""``check``, ``apply`` and ``revert``: the three things the tool does to a target with a series.

Every action first simulates the whole series in memory (see :mod:`lightning_ext.patches._simulate`); ``apply`` and
``revert`` write only if the simulation says the whole action will succeed, and then all-or-nothing.

"""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lightning_ext.patches._errors import SeriesNotApplicableError
from lightning_ext.patches._locate import find_series, resolve_target, target_version
from lightning_ext.patches._report import SeriesReport, SeriesState
from lightning_ext.patches._series import load_series
from lightning_ext.patches._simulate import Plan, simulate
from lightning_ext.patches._write import write_all

__all__ = ["PatchOutcome", "apply", "check", "revert"]

Action = Literal["applied", "already applied", "reverted", "not applied"]


@dataclass(frozen=True)
class PatchOutcome:
    """What ``apply`` or ``revert`` did.

    Attributes:
        action: ``"applied"``, ``"already applied"`` (nothing written), ``"reverted"`` or ``"not applied"`` (nothing
            to revert, nothing written).
        written: the files written, in order (empty when nothing was written).
        report: the check report the action was based on.

    """

    action: Action
    written: tuple[Path, ...]
    report: SeriesReport

    def message(self) -> str:
        """One line for people."""
        report = self.report
        if self.action == "applied":
            names = ", ".join(report.pending_patches)
            return f"applied {names} to {report.target}: wrote {len(self.written)} file(s)"
        if self.action == "reverted":
            names = ", ".join(reversed(report.applied_patches))
            return f"reverted {names} in {report.target}: restored {len(self.written)} file(s)"
        if self.action == "already applied":
            return f"the series {report.series} is already applied to {report.target}; nothing written"
        return f"the series {report.series} is not applied to {report.target}; nothing to revert"


def check(*, target: Path | str | None = None, series: Path | str | None = None) -> SeriesReport:
    """Simulate the series against the target, in memory, and report hunk by hunk; writes nothing.

    Args:
        target: the ``lightning`` package directory; the installed one by default.
        series: the series directory; ``<repository>/patches/lightning-<target's version>`` by default.

    Returns:
        The report; ``report.ok`` is true if the series applies cleanly or is already fully applied.

    Raises:
        PatchError: the target or series cannot be found or read, a patch is malformed or unsupported, or a path in
            it escapes the target.

    """
    return _plan(target, series).report


def apply(*, target: Path | str | None = None, series: Path | str | None = None) -> PatchOutcome:
    """Apply the whole series to the target, all-or-nothing; do nothing if it is already applied.

    Args:
        target: the ``lightning`` package directory; the installed one by default.
        series: the series directory; ``<repository>/patches/lightning-<target's version>`` by default.

    Raises:
        SeriesNotApplicableError: some hunk fails, or the tree is partially patched; nothing was written.
        PatchError: as :func:`check`, or a write failed (every file already written was restored).

    """
    plan = _plan(target, series)
    state = plan.report.state
    if state is SeriesState.APPLIED:
        return PatchOutcome(action="already applied", written=(), report=plan.report)
    if state is not SeriesState.CLEAN:
        raise _refusal("apply", plan.report)
    written = write_all(plan.patched, expected=plan.current)
    return PatchOutcome(action="applied", written=written, report=plan.report)


def revert(*, target: Path | str | None = None, series: Path | str | None = None) -> PatchOutcome:
    """Undo the applied patches (last first), all-or-nothing, restoring the original bytes; nothing if none is applied.

    A partially patched tree is reverted too, if the patches not applied would apply on top of the applied ones.

    Args:
        target: the ``lightning`` package directory; the installed one by default.
        series: the series directory; ``<repository>/patches/lightning-<target's version>`` by default.

    Raises:
        SeriesNotApplicableError: parts of the series are in the target but it is neither fully nor consistently
            partially applied; nothing was written.
        PatchError: as :func:`check`, or a write failed (every file already written was restored).

    """
    plan = _plan(target, series)
    if plan.report.state in (SeriesState.APPLIED, SeriesState.PARTIAL):
        written = write_all(plan.original, expected=plan.current)
        return PatchOutcome(action="reverted", written=written, report=plan.report)
    if plan.report.nothing_applied:
        return PatchOutcome(action="not applied", written=(), report=plan.report)
    raise _refusal("revert", plan.report)


def _plan(target: Path | str | None, series: Path | str | None) -> Plan:
    directory = resolve_target(None if target is None else Path(target))
    version = target_version(directory)
    series_dir = find_series(directory) if series is None else Path(series).resolve()
    return simulate(load_series(series_dir), target=directory, version=version)


def _refusal(action: str, report: SeriesReport) -> SeriesNotApplicableError:
    advice = " (revert undoes the applied ones)" if report.state is SeriesState.PARTIAL else ""
    return SeriesNotApplicableError(
        f"refusing to {action}: {report.summary()}{advice}; nothing was written", report=report
    )
