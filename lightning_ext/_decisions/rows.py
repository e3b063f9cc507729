"""One decision's observations packed into one small row of numbers, and the reduced row read back; pure."""

import functools
import math
import struct
from dataclasses import dataclass
from typing import Literal

__all__ = ["Agreement", "Observation", "RowLayout", "combine", "pack", "unpack"]

Number = int | float
Kind = Literal["vote", "mean", "min", "max"]

_INT64_MIN = -(2**63)
_ABSENT_KEY = _INT64_MIN + 1  # an extra that rank 0 lacks (min/max layouts); no float maps below key(-inf)
_CANONICAL_NAN_BITS = 0x7FF8000000000000
_ABSENT_BITS = 0x7FF4000000000001  # a NaN pattern that canonicalisation never produces (vote layout)
_WORD_LIMIT = 2**62
_FLOAT_EXACT_LIMIT = 2**53
# vote word digits, least significant first
_PRESENT, _YES, _RANK_ZERO_YES, _NONFINITE, _FAILED = range(5)
_VOTE_DIGITS = 5


@dataclass(frozen=True)
class Observation:
    """What one rank brings to one decision.

    Attributes:
        value: the rank's monitored value, or ``None`` where the metric is missing on this rank.
        vote: the rank's own decision (vote policies; ignored by aggregate layouts).
        extras: values of the other metrics in the checkpoint file name (``None``: missing); rank 0's are used.
        failed: this rank could not make its local decision; every rank will raise.

    """

    value: float | None
    vote: bool = False
    extras: tuple[float | None, ...] = ()
    failed: bool = False


@dataclass(frozen=True)
class Agreement:
    """What every rank reads back from the reduced row (identical on every rank).

    Attributes:
        presence: whether the metric is on ``"all"`` ranks, on ``"none"``, or ``"mixed"`` (an error).
        failed: at least one rank could not make its local decision (an error).
        yes: how many ranks voted yes (vote layout; else 0).
        rank_zero_vote: what rank 0 voted (vote layout; else False).
        nonfinite: at least one rank's value is NaN or infinite (for ``mean``: the sum is not finite).
        value: the agreed value (aggregate layouts), rank 0's value (vote layout with reference), else NaN.
        extras: rank 0's values of the other file-name metrics (``None`` where rank 0 lacks one).

    """

    presence: Literal["all", "none", "mixed"]
    failed: bool
    yes: int
    rank_zero_vote: bool
    nonfinite: bool
    value: float
    extras: tuple[float | None, ...]


@dataclass(frozen=True)
class RowLayout:
    """The fixed shape of one decision's row: which policy kind, how many ranks, what it carries.

    Args:
        kind: ``"vote"``, ``"mean"``, ``"min"`` or ``"max"``.
        world_size: the number of ranks taking part.
        with_reference: vote layout only: also carry rank 0's value (for file names and top-k ordering).
        extras: how many other file-name metrics to carry from rank 0.

    """

    kind: Kind
    world_size: int
    with_reference: bool = False
    extras: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("vote", "mean", "min", "max"):
            raise ValueError(f"Unknown layout kind {self.kind!r}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.kind == "mean" and self._base * self._base * 2**self.extras >= _FLOAT_EXACT_LIMIT:
            raise ValueError(
                f"Cannot carry {self.extras} file-name metrics exactly at world size {self.world_size}; use fewer"
                " metrics in the checkpoint file name"
            )

    @property
    def op(self) -> Literal["sum", "max"]:
        """The element-wise reduction the collective must apply."""
        return "max" if self.kind in ("min", "max") else "sum"

    @property
    def dtype(self) -> Literal["int64", "float64"]:
        """The element type of the row."""
        return "float64" if self.kind == "mean" else "int64"

    @property
    def size(self) -> int:
        """The number of elements in the row."""
        if self.kind == "vote":
            return self._vote_words + int(self.with_reference) + self.extras
        return 2 + self.extras

    @property
    def _base(self) -> int:
        return self.world_size + 1

    @property
    def _digits_per_word(self) -> int:
        return _digits_per_word(self._base)

    @property
    def _vote_words(self) -> int:
        return -(-_VOTE_DIGITS // self._digits_per_word)


def pack(layout: RowLayout, observation: Observation, *, rank: int) -> list[Number]:
    """The row this rank contributes to the collective."""
    present = observation.value is not None and not observation.failed
    value = observation.value if present else None
    if len(observation.extras) != layout.extras:
        raise ValueError(f"RowLayout carries {layout.extras} extras, observation has {len(observation.extras)}")
    if layout.kind == "vote":
        return _pack_vote(layout, observation, value, rank)
    if layout.kind == "mean":
        return _pack_mean(layout, observation, value, rank)
    return _pack_extreme(layout, observation, value, rank)


def combine(layout: RowLayout, rows: list[list[Number]]) -> list[Number]:
    """Reduce the rows of all ranks in one process, exactly as the collective does (element-wise sum or max).

    Example:
        >>> layout = RowLayout("mean", world_size=2)
        >>> rows = [pack(layout, Observation(1.0), rank=0), pack(layout, Observation(2.0), rank=1)]
        >>> unpack(layout, combine(layout, rows)).value
        1.5

    """
    reduce = max if layout.op == "max" else sum
    return [reduce(column) for column in zip(*rows, strict=True)]


def unpack(layout: RowLayout, reduced: list[Number]) -> Agreement:
    """Read the reduced row back; every rank gets the same result from the same row."""
    if len(reduced) != layout.size:
        raise ValueError(f"Expected a row of {layout.size} elements, got {len(reduced)}")
    if layout.kind == "vote":
        return _unpack_vote(layout, reduced)
    if layout.kind == "mean":
        return _unpack_mean(layout, reduced)
    return _unpack_extreme(layout, reduced)


def _pack_vote(layout: RowLayout, observation: Observation, value: float | None, rank: int) -> list[Number]:
    present = value is not None
    digits = [0] * _VOTE_DIGITS
    digits[_PRESENT] = int(present)
    digits[_YES] = int(present and observation.vote)
    digits[_RANK_ZERO_YES] = int(present and observation.vote and rank == 0)
    digits[_NONFINITE] = int(value is not None and not math.isfinite(value))
    digits[_FAILED] = int(observation.failed)
    row: list[Number] = _digits_to_words(layout, digits)
    if layout.with_reference:
        row.append(_float_bits(value) if rank == 0 and value is not None else 0)
    for extra in observation.extras:
        row.append((_ABSENT_BITS if extra is None else _float_bits(extra)) if rank == 0 else 0)
    return row


def _unpack_vote(layout: RowLayout, reduced: list[Number]) -> Agreement:
    words = layout._vote_words
    digits = _words_to_digits(layout, [int(x) for x in reduced[:words]])
    position = words
    value = math.nan
    if layout.with_reference:
        value = _bits_float(int(reduced[position]))
        position += 1
    extras = tuple(None if int(x) == _ABSENT_BITS else _bits_float(int(x)) for x in reduced[position:])
    return Agreement(
        presence=_presence(digits[_PRESENT], layout.world_size),
        failed=digits[_FAILED] > 0,
        yes=digits[_YES],
        rank_zero_vote=digits[_RANK_ZERO_YES] > 0,
        nonfinite=digits[_NONFINITE] > 0,
        value=value,
        extras=extras,
    )


def _pack_mean(layout: RowLayout, observation: Observation, value: float | None, rank: int) -> list[Number]:
    mask = 0
    extras: list[Number] = []
    for position, extra in enumerate(observation.extras):
        if rank == 0 and extra is not None:
            mask |= 1 << position
        extras.append(extra if rank == 0 and extra is not None else 0.0)
    base = layout._base
    head = int(value is not None) + base * int(observation.failed) + base * base * mask
    return [float(head), 0.0 if value is None else value, *extras]


def _unpack_mean(layout: RowLayout, reduced: list[Number]) -> Agreement:
    base = layout._base
    head = int(reduced[0])
    present, failed, mask = head % base, (head // base) % base, head // (base * base)
    total = float(reduced[1])
    extras = tuple(float(x) if mask >> position & 1 else None for position, x in enumerate(reduced[2:]))
    return Agreement(
        presence=_presence(present, layout.world_size),
        failed=failed > 0,
        yes=0,
        rank_zero_vote=False,
        nonfinite=not math.isfinite(total),
        value=total / layout.world_size,
        extras=extras,
    )


def _pack_extreme(layout: RowLayout, observation: Observation, value: float | None, rank: int) -> list[Number]:
    # under max: 4 = some rank failed, 2 = some rank lacks the metric, 1 = some rank's value is not finite
    flags = 4 * int(observation.failed) + 2 * int(value is None) + int(value is not None and not math.isfinite(value))
    key = _INT64_MIN if value is None else _order_key(-value if layout.kind == "min" else value)
    extras: list[Number] = []
    for extra in observation.extras:
        if rank != 0:
            extras.append(_INT64_MIN)
        else:
            extras.append(_ABSENT_KEY if extra is None else _order_key(extra))
    return [flags, key, *extras]


def _unpack_extreme(layout: RowLayout, reduced: list[Number]) -> Agreement:
    flags, key = int(reduced[0]), int(reduced[1])
    some_absent = bool(flags & 2) or flags >= 4
    some_present = key != _INT64_MIN
    if some_absent and some_present:
        presence: Literal["all", "none", "mixed"] = "mixed"
    elif some_present:
        presence = "all"
    else:
        presence = "none"
    value = math.nan
    if some_present:
        value = _order_key_inverse(key)
        if layout.kind == "min":
            value = -value
    extras = tuple(None if int(x) == _ABSENT_KEY else _order_key_inverse(int(x)) for x in reduced[2:])
    return Agreement(
        presence=presence,
        failed=flags >= 4,
        yes=0,
        rank_zero_vote=False,
        nonfinite=bool(flags & 1),
        value=value,
        extras=extras,
    )


@functools.lru_cache(maxsize=64)
def _digits_per_word(base: int) -> int:
    """How many base-``base`` digits an int64 word holds with room to sum them (cached: it is on the hot path)."""
    digits, span = 0, 1
    while span * base <= _WORD_LIMIT:
        span *= base
        digits += 1
    return digits


def _presence(count: int, world_size: int) -> Literal["all", "none", "mixed"]:
    if count == world_size:
        return "all"
    return "none" if count == 0 else "mixed"


def _digits_to_words(layout: RowLayout, digits: list[int]) -> list[Number]:
    per_word, base = layout._digits_per_word, layout._base
    words: list[Number] = []
    for start in range(0, len(digits), per_word):
        word = 0
        for digit in reversed(digits[start : start + per_word]):
            word = word * base + digit
        words.append(word)
    return words


def _words_to_digits(layout: RowLayout, words: list[int]) -> list[int]:
    per_word, base = layout._digits_per_word, layout._base
    digits: list[int] = []
    for word in words:
        for _ in range(min(per_word, _VOTE_DIGITS - len(digits))):  # only the digits we packed
            word, digit = divmod(word, base)
            digits.append(digit)
    return digits


def _float_bits(value: float) -> int:
    """The IEEE-754 bits of a float64 as a signed int64, with every NaN made the same NaN."""
    if math.isnan(value):
        bits: int = _CANONICAL_NAN_BITS
        return bits
    signed: int = struct.unpack("<q", struct.pack("<d", value))[0]
    return signed


def _bits_float(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<q", bits))[0]
    return value


def _order_key(value: float) -> int:
    """An int64 that sorts like the float: -inf < ... < -0.0 < +0.0 < ... < +inf < NaN (NaN wins a max)."""
    bits = _float_bits(value)
    return bits if bits >= 0 else bits ^ 0x7FFFFFFFFFFFFFFF


def _order_key_inverse(key: int) -> float:
    return _bits_float(key if key >= 0 else key ^ 0x7FFFFFFFFFFFFFFF)
