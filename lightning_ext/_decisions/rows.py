"""One decision's observations as one small row per rank, and the agreement every rank derives from all rows; pure."""

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Agreement", "Observation", "RankView", "RowLayout", "agree_rows", "pack"]

Kind = Literal["vote", "mean", "min", "max"]
Presence = Literal["all", "none", "mixed"]

_CANONICAL_NAN_BITS = 0x7FF8000000000000
_ABSENT_BITS = 0x7FF4000000000001  # a NaN pattern that canonicalisation never produces: "no value"
_PRESENT, _VOTE, _FAILED = 1, 2, 4  # the flags element
_HEAD = 4  # flags, value, reference, detail


@dataclass(frozen=True)
class Observation:
    """What one rank brings to one decision.

    Attributes:
        value: the rank's monitored value, or ``None`` where the metric is missing on this rank.
        vote: the rank's own decision (vote policies; ignored by aggregate layouts).
        extras: values of the other metrics in the checkpoint file name (``None``: missing); rank 0's are used.
        failed: this rank could not make its local decision; every rank will raise.
        reference: what the rank compared its value with (its own k-th best, or its best score), if anything.
        detail: a count that explains the vote (the size of its own top-k, or its wait count).

    """

    value: float | None
    vote: bool = False
    extras: tuple[float | None, ...] = ()
    failed: bool = False
    reference: float | None = None
    detail: int = 0


@dataclass(frozen=True)
class RankView:
    """One rank's part of a decision, as every rank received it."""

    value: float | None
    vote: bool | None
    failed: bool
    reference: float | None
    detail: int


@dataclass(frozen=True)
class Agreement:
    """What every rank derives from the rows (identical on every rank).

    Attributes:
        presence: whether the metric is on ``"all"`` ranks, on ``"none"``, or ``"mixed"``.
        failed: at least one rank could not make its local decision (an error).
        yes: how many ranks voted yes (vote layout; else 0).
        rank_zero_vote: what rank 0 voted (vote layout; else False).
        nonfinite: at least one rank's value is NaN or infinite.
        value: the agreed value (aggregate layouts), rank 0's value (vote layout), NaN where there is none.
        extras: rank 0's values of the other file-name metrics (``None`` where rank 0 lacks one).
        ranks: every rank's part, in rank order.

    """

    presence: Presence
    failed: bool
    yes: int
    rank_zero_vote: bool
    nonfinite: bool
    value: float
    extras: tuple[float | None, ...]
    ranks: tuple[RankView, ...]


@dataclass(frozen=True)
class RowLayout:
    """The fixed shape of one decision's rows: the policy kind, how many ranks, how many file-name metrics."""

    kind: Kind
    world_size: int
    extras: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("vote", "mean", "min", "max"):
            raise ValueError(f"Unknown layout kind {self.kind!r}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")

    @property
    def size(self) -> int:
        """The number of int64 elements in each rank's row."""
        return _HEAD + self.extras


def pack(layout: RowLayout, observation: Observation, *, rank: int) -> list[int]:
    """The row this rank contributes."""
    if len(observation.extras) != layout.extras:
        raise ValueError(f"Layout carries {layout.extras} extras, observation has {len(observation.extras)}")
    present = observation.value is not None and not observation.failed
    flags = _PRESENT * present + _VOTE * (present and observation.vote) + _FAILED * observation.failed
    extras = [_bits(extra) if rank == 0 else _ABSENT_BITS for extra in observation.extras]
    value = observation.value if present else None
    return [flags, _bits(value), _bits(observation.reference), int(observation.detail), *extras]


def agree_rows(layout: RowLayout, rows: Sequence[Sequence[int]]) -> Agreement:
    """The agreement that every rank derives from every rank's row (in rank order): the same rows, the same result.

    The mean is summed in rank order; a NaN on any rank makes ``min``/``max`` NaN, as ``torch.min``/``torch.max``.

    Example:
        >>> layout = RowLayout("mean", world_size=2)
        >>> rows = [pack(layout, Observation(1.0), rank=0), pack(layout, Observation(2.0), rank=1)]
        >>> agreement = agree_rows(layout, rows)
        >>> agreement.value, [view.value for view in agreement.ranks]
        (1.5, [1.0, 2.0])

    """
    if len(rows) != layout.world_size or any(len(row) != layout.size for row in rows):
        raise ValueError(f"Expected {layout.world_size} rows of {layout.size} elements")
    ranks = tuple(_view(row) for row in rows)
    values = [view.value for view in ranks if view.value is not None]
    present = len(values)
    presence: Presence = "all" if present == layout.world_size else "none" if present == 0 else "mixed"
    if layout.kind == "vote":
        value = ranks[0].value if ranks[0].value is not None else math.nan
    elif presence != "all":
        value = math.nan
    elif layout.kind == "mean":
        value = sum(values) / layout.world_size
    elif any(math.isnan(v) for v in values):
        value = math.nan
    else:
        value = min(values) if layout.kind == "min" else max(values)
    return Agreement(
        presence=presence,
        failed=any(view.failed for view in ranks),
        yes=sum(bool(view.vote) for view in ranks) if layout.kind == "vote" else 0,
        rank_zero_vote=layout.kind == "vote" and bool(ranks[0].vote),
        nonfinite=any(not math.isfinite(v) for v in values),
        value=value,
        extras=tuple(_float(int(x)) for x in rows[0][_HEAD:]),
        ranks=ranks,
    )


def _view(row: Sequence[int]) -> RankView:
    flags = int(row[0])
    present = bool(flags & _PRESENT)
    return RankView(
        value=_float(int(row[1])) if present else None,
        vote=bool(flags & _VOTE) if present else None,
        failed=bool(flags & _FAILED),
        reference=_float(int(row[2])),
        detail=int(row[3]),
    )


def _bits(value: float | None) -> int:
    """The IEEE-754 bits of a float64 as a signed int64 (every NaN made the same NaN); ``None``: the absent mark."""
    if value is None:
        return _ABSENT_BITS
    if math.isnan(value):
        return _CANONICAL_NAN_BITS
    signed: int = struct.unpack("<q", struct.pack("<d", value))[0]
    return signed


def _float(bits: int) -> float | None:
    if bits == _ABSENT_BITS:
        return None
    value: float = struct.unpack("<d", struct.pack("<q", bits))[0]
    return value
