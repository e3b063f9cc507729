"""When the facts prove that a rank cannot reach the check the others wait in; pure, testable in one process."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lightning_ext._watch.rank_facts import Facts

__all__ = ["blocked_by", "deadlock", "diagnosed"]


def blocked_by(waiting: Sequence[Facts], rank: Facts) -> str | None:
    """What keeps ``rank`` from ever reaching the check that the ``waiting`` ranks wait in, or ``None``.

    A waiting rank makes no collective call and no backward pass until the check completes, and the check completes
    only when ``rank`` arrives. So ``rank`` can never arrive if it is inside

    * a collective call that some waiting rank has not made: its number on its group is beyond that rank's count
      (``"collective"``); or
    * a backward pass whose gradients DDP all-reduces, beyond the synced backward passes some waiting rank has
      completed: it cannot end before that rank's matching all-reduce, which comes after the check (``"backward"``).

    Anything else (computing, loading data, writing a checkpoint, a backward pass without gradient sync, a collective
    call every waiting rank has made) is work that will end: ``None``, and the check waits.

    Example:
        >>> waiting = [Facts(0, check=(3, "a synced log"), counts={"world": 7}, backwards=1)]
        >>> blocked_by(waiting, Facts(1, counts={"world": 7}, backward=2, backwards=1))
        'backward'
        >>> blocked_by(waiting, Facts(1, counts={"world": 7}, backwards=1)) is None  # computing: wait
        True

    """
    if not waiting:
        return None
    inside = rank.inside
    if inside is not None and inside.index > min(facts.counts.get(inside.group, 0) for facts in waiting):
        return "collective"
    if rank.backward is not None and rank.backward > min(facts.backwards for facts in waiting):
        return "backward"
    return None


def deadlock(check: int, everyone: Sequence[Facts]) -> tuple[list[Facts], list[Facts]] | None:
    """``(waiting, missing)`` if every rank's facts prove that check number ``check`` can never complete, else ``None``.

    A rank that has passed the check already proves that every rank joined it (it is completing, whatever the other
    ranks' facts say: theirs may have been read just before they saw it complete). Otherwise the ranks that wait in it
    wait for the others, and it is a deadlock when each of those is blocked (:func:`blocked_by`).

    Example:
        >>> waiting = Facts(0, check=(3, "a synced log"), checks=2, counts={"world": 7}, backwards=1)
        >>> deadlock(3, [waiting, Facts(1, checks=2, backward=2, backwards=1)]) is not None
        True
        >>> deadlock(3, [waiting, Facts(1, checks=3, backward=2, backwards=1)]) is None  # it passed check 3
        True

    """
    if any(facts.checks >= check for facts in everyone):
        return None
    waiting = [facts for facts in everyone if facts.check is not None and facts.check[0] == check]
    missing = [facts for facts in everyone if facts.check is None or facts.check[0] != check]
    if missing and all(blocked_by(waiting, facts) is not None for facts in missing):
        return waiting, missing
    return None


def diagnosed(mine: Facts, others: Mapping[int, Facts], world_size: int) -> tuple[list[Facts], list[Facts]] | None:
    """The deadlock that a rank waiting in a check proves from its own facts (``mine``) and the ``others`` that
    answered its inquiry, or ``None``.

    The check is the one ``mine`` waits in (its number, as every rank numbers them). A rank that did not answer
    proves nothing (its process may be gone, or busy): with fewer than ``world_size - 1`` answers, no verdict.

    Example:
        >>> mine = Facts(0, check=(3, "a synced log"), checks=2, counts={"world": 7}, backwards=1)
        >>> diagnosed(mine, {1: Facts(1, checks=2, backward=2, backwards=1)}, 2) is not None
        True
        >>> diagnosed(mine, {1: Facts(1, checks=2, backward=2, backwards=1)}, 3) is None  # rank 2 did not answer
        True

    """
    if mine.check is None or len(others) < world_size - 1:
        return None
    return deadlock(mine.check[0], [mine, *others.values()])
