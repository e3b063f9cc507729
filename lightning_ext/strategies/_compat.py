"""What differs between the Lightning release lines lightning-ext supports (2.5.x and 2.6.x), kept in one place.

lightning-ext reaches into a few private Lightning methods (:mod:`lightning_ext.strategies._runtime`), so each release
it runs on is verified: the test suite passes against it and ``patches/`` carries a series for it. The verified releases
are :data:`VERIFIED`. Elsewhere in ``lightning>=2.5,<2.7`` lightning-ext still runs, after one warning
(:func:`warn_if_unverified`); the runtime seams check every method they wrap before wrapping it.

What 2.6 added that lightning-ext writes to, and 2.5 lacks: ``EarlyStopping.stopping_reason`` (an
``EarlyStoppingReason``) and ``EarlyStopping.stopping_reason_message``. On 2.5 the decisions leave them out, as
stock Lightning 2.5 does (:func:`record_stop_message`, :func:`record_nonfinite_stop`).
"""

import lightning
from lightning.pytorch.utilities import rank_zero_warn

__all__ = ["VERIFIED", "lightning_version", "warn_if_unverified"]

VERIFIED = ("2.5.6", "2.6.6")
"""The Lightning releases the test suite and the patch series are verified against (one per supported minor line)."""

_WARNED: list[str] = []  # the version warned about, once per process


def lightning_version() -> str:
    """The installed Lightning's version (``lightning.__version__``, read at each call).

    Example:
        >>> lightning_version().startswith("2.")
        True

    """
    return str(lightning.__version__)


def warn_if_unverified() -> None:
    """Warn once per process (on rank 0) when the installed Lightning is not one of :data:`VERIFIED`."""
    version = lightning_version()
    if version in VERIFIED or version in _WARNED:
        return
    _WARNED.append(version)
    rank_zero_warn(
        f"lightning-ext is verified with Lightning {' and '.join(VERIFIED)}; the installed Lightning is {version}."
        " It reaches into some private Lightning methods and checks their signatures before it wraps them, but"
        " behaviour on other releases is not tested. Install a verified release (e.g. `pip install"
        f" 'lightning=={VERIFIED[-1]}'`) if anything misbehaves.",
        category=UserWarning,
    )
