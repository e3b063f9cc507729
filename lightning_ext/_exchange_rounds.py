"""The rounds of a hang check's exchange (``_collective.CheckChannel``): who talks to whom, and what each round does
with the values a check carries. Pure: no communication here."""

from typing import Any, Protocol

import numpy as np

__all__ = ["CARRY_BYTES", "COMBINE", "SEND", "TAKE", "Carried", "exchange_partners", "roles"]

CARRY_BYTES = 512  # what a check message carries beside its (min, max): a hook's step values (``_sync/carried.py``)
COMBINE, SEND, TAKE = "combine", "send", "take"  # what a round does with the partner's carried values


class Carried(Protocol):
    """Values that ride a check (the coalesced sync's step values, ``_sync/carried.py``), reduced over every rank as
    the check's rounds pass them on: no collective of their own."""

    data: "np.ndarray[Any, np.dtype[np.uint8]]"  # CARRY_BYTES: this rank's running values, sent in every round
    layout: tuple[Any, ...]  # how the bytes are laid out: part of what the ranks must agree on before they are read

    def combine(self, theirs: "np.ndarray[Any, np.dtype[np.uint8]]", first: bool) -> None:
        """Reduce ``theirs`` (a partner's running values) into :attr:`data`; ``first``: this rank's operand comes first
        (the lower rank's does, so both partners compute the same bits)."""


def exchange_partners(rank: int, world_size: int) -> list[int]:
    """The partner of ``rank`` in each round of a check (see ``_collective.CheckChannel``).

    Example:
        >>> exchange_partners(0, 4), exchange_partners(2, 3), exchange_partners(0, 3)
        ([1, 2], [0, 0], [2, 1, 2])

    """
    power = _largest_power(world_size)
    if rank >= power:  # fold into a partner, take the result back
        return [rank - power, rank - power]
    butterfly = [rank ^ distance for distance in _powers_below(power)]
    extra = rank + power
    return [extra, *butterfly, extra] if extra < world_size else butterfly


def _largest_power(world_size: int) -> int:
    """The largest power of two not above ``world_size``: the ranks of the butterfly."""
    power = 1
    while power * 2 <= world_size:
        power *= 2
    return power


def _powers_below(limit: int) -> list[int]:
    powers, value = [], 1
    while value < limit:
        powers.append(value)
        value *= 2
    return powers


def roles(rank: int, world_size: int) -> list[str]:
    """What each round of :func:`exchange_partners` does with the partner's carried values.

    A rank beyond the largest power of two sends its values, then takes the result; its partner folds them in first
    and ignores what they send back last; the butterfly's rounds combine.

    Example:
        >>> roles(0, 4), roles(2, 3), roles(0, 3), roles(1, 3)
        (['combine', 'combine'], ['send', 'take'], ['combine', 'combine', 'send'], ['combine'])

    """
    rounds = exchange_partners(rank, world_size)
    power = _largest_power(world_size)
    if rank >= power:
        return [SEND, TAKE]
    if rank + power < world_size:
        return [COMBINE] * (len(rounds) - 1) + [SEND]
    return [COMBINE] * len(rounds)
