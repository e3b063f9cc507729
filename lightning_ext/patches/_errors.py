"""The errors the patch tool raises: each one says, in one line, what is wrong and that nothing was written."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_ext.patches._report import SeriesReport

__all__ = ["PatchError", "SeriesNotApplicableError"]


class PatchError(Exception):
    """A patch series that cannot be checked, applied or reverted as asked.

    Raised for a missing or malformed series, a path that leaves the target, an unsupported kind of change, or a
    write that failed (after every file already written was restored). The message is one line.

    """


class SeriesNotApplicableError(PatchError):
    """The target is not in a state the requested action accepts (conflicting or partially applied); nothing written.

    Attributes:
        report: the hunk-by-hunk report that explains why.

    """

    def __init__(self, message: str, *, report: SeriesReport) -> None:
        super().__init__(message)
        self.report = report
