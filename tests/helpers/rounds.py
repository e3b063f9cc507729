"""A hang check's rounds played by hand in one process, every rank's exchanges paired as the pair groups pair them."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["play_rounds"]


def play_rounds(plans: list[list[int]], meet: Callable[[int, int, int, int], None]) -> None:
    """Pair the exchanges of ``plans`` (each rank's partner per round) in order, and call ``meet(rank, partner, its
    round, the partner's round)`` once per exchange of two ranks; fail if the rounds deadlock."""
    world = len(plans)
    position = [0] * world
    while any(position[rank] < len(plans[rank]) for rank in range(world)):
        progressed = False
        for rank in range(world):
            if position[rank] == len(plans[rank]):
                continue
            partner = plans[rank][position[rank]]
            n = plans[rank][: position[rank]].count(partner)  # the n-th exchange of this pair, on both sides
            if (
                position[partner] < len(plans[partner])
                and plans[partner][position[partner]] == rank
                and plans[partner][: position[partner]].count(rank) == n
            ):
                meet(rank, partner, position[rank], position[partner])
                position[rank] += 1
                position[partner] += 1
                progressed = True
        assert progressed, "the rounds deadlock"
