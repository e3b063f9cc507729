"""The rounds of a hang check's exchange (``_collective.CheckChannel``): each rank's partner in each round. Pure."""

__all__ = ["exchange_partners"]


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
