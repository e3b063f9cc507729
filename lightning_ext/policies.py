"""Cross-rank decision policies: the rules that turn every rank's observation into one decision; pure."""

import re
from abc import ABC, abstractmethod
from fractions import Fraction
from typing import Literal, NamedTuple

__all__ = [
    "AggregatePolicy",
    "AllRanks",
    "AnyRank",
    "DecisionPolicy",
    "Majority",
    "PolicyLike",
    "Quorum",
    "RankZero",
    "VotePolicy",
    "VoteTally",
    "available_policies",
    "resolve_policy",
]

Reduction = Literal["mean", "min", "max"]
_REDUCTIONS: tuple[Reduction, ...] = ("mean", "min", "max")


class VoteTally(NamedTuple):
    """The votes of all ranks on one decision.

    Attributes:
        yes: how many ranks voted for the action (save a checkpoint, stop training).
        world_size: how many ranks voted.
        rank_zero: what global rank 0 voted.

    """

    yes: int
    world_size: int
    rank_zero: bool


class DecisionPolicy(ABC):
    """Base of every decision policy. Subclass :class:`VotePolicy` for a policy of your own."""

    @property
    @abstractmethod
    def kind(self) -> Literal["vote", "aggregate"]:
        """Whether ranks vote (``"vote"``) or reduce the monitored value first (``"aggregate"``)."""

    def describe(self) -> str:
        """A stable text that names the policy and its settings, identical on every rank that configured it alike.

        The strategy compares it across ranks at set-up; override it if your policy's ``repr`` is not stable.

        """
        return f"{type(self).__module__}.{type(self).__qualname__}:{self!r}"

    def validate(self, world_size: int) -> None:  # noqa: B027 (an optional hook)
        """Raise ``ValueError`` if the policy cannot work at this world size (called once, at set-up)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DecisionPolicy) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(self.describe())


class VotePolicy(DecisionPolicy):
    """A policy that decides from the tally of every rank's own vote.

    Implement :meth:`decide`. It runs on every rank with the same tally, so it must be deterministic and must return a
    plain ``bool``. Give the class a stable ``__repr__`` (the default one includes the object's address): it is how
    ranks check that they were configured alike.

    Example:
        >>> class TwoThirds(VotePolicy):
        ...     def decide(self, tally: VoteTally) -> bool:
        ...         return 3 * tally.yes >= 2 * tally.world_size
        ...     def __repr__(self) -> str:
        ...         return "TwoThirds()"
        >>> TwoThirds().decide(VoteTally(yes=2, world_size=3, rank_zero=False))
        True

    """

    @property
    def kind(self) -> Literal["vote"]:
        return "vote"

    @abstractmethod
    def decide(self, tally: VoteTally) -> bool:
        """Turn the votes into one decision."""


class AllRanks(VotePolicy):
    """Act only if every rank votes for it (stock ``ModelCheckpoint`` behaviour)."""

    def decide(self, tally: VoteTally) -> bool:
        return tally.yes == tally.world_size

    def __repr__(self) -> str:
        return "AllRanks()"


class AnyRank(VotePolicy):
    """Act if at least one rank votes for it (stock ``EarlyStopping`` behaviour)."""

    def decide(self, tally: VoteTally) -> bool:
        return tally.yes > 0

    def __repr__(self) -> str:
        return "AnyRank()"


class Majority(VotePolicy):
    """Act if strictly more than half of the ranks vote for it (a tie does not act)."""

    def decide(self, tally: VoteTally) -> bool:
        return 2 * tally.yes > tally.world_size

    def __repr__(self) -> str:
        return "Majority()"


class RankZero(VotePolicy):
    """Follow global rank 0's own decision."""

    def decide(self, tally: VoteTally) -> bool:
        return tally.rank_zero

    def __repr__(self) -> str:
        return "RankZero()"


class Quorum(VotePolicy):
    """Act if at least ``k`` ranks vote for it, or at least the fraction ``k`` of them, rounded up.

    Args:
        k: a whole number of ranks (from 1 to the world size), or a fraction between 0 and 1: ``Quorum(0.75)`` needs
            75% of the ranks, rounded up, at any world size (the decimal you wrote, exactly: ``Quorum(0.1)`` at 10
            ranks needs 1). For every rank, use ``"all"``.

    Example:
        >>> Quorum(3).decide(VoteTally(yes=3, world_size=4, rank_zero=False))
        True
        >>> [Quorum(0.75).needed(world) for world in (1, 4, 5, 8)]
        [1, 3, 4, 6]

    """

    def __init__(self, k: int | float) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, float)) or (isinstance(k, int) and k < 1):
            raise ValueError(
                f"Quorum(k) needs a whole number of ranks k >= 1, or a fraction such as Quorum(0.75), got {k!r}"
            )
        if isinstance(k, float) and not 0.0 < k < 1.0:
            raise ValueError(
                f"Quorum({k!r}): a fraction of the ranks is between 0 and 1, e.g. Quorum(0.75); for a number of ranks"
                " pass a whole number, e.g. Quorum(3); for every rank use 'all'"
            )
        self.k = k
        self._fraction = Fraction(repr(k)) if isinstance(k, float) else None

    def needed(self, world_size: int) -> int:
        """How many yes votes it takes at this world size."""
        if self._fraction is None:
            return int(self.k)
        return -(-self._fraction.numerator * world_size // self._fraction.denominator)

    def decide(self, tally: VoteTally) -> bool:
        return tally.yes >= self.needed(tally.world_size)

    def validate(self, world_size: int) -> None:
        if self.needed(world_size) > world_size:
            raise ValueError(f"{self!r} can never be met: only {world_size} rank(s) vote")

    def __repr__(self) -> str:
        return f"Quorum(k={self.k!r})"


class AggregatePolicy(DecisionPolicy):
    """Reduce the monitored value across ranks, then let the stock comparison decide once on the agreed value.

    ``mean`` is the unweighted mean over ranks; ``min`` and ``max`` pick the extreme. A NaN on any rank makes the
    agreed value NaN (as ``torch.mean``/``torch.min``/``torch.max`` would), and ``+inf`` with ``-inf`` make a NaN mean.

    Args:
        reduction: ``"mean"``, ``"min"`` or ``"max"``.

    """

    def __init__(self, reduction: Reduction) -> None:
        if reduction not in _REDUCTIONS:
            raise ValueError(f"AggregatePolicy reduction must be one of {list(_REDUCTIONS)}, got {reduction!r}")
        self.reduction: Reduction = reduction

    @property
    def kind(self) -> Literal["aggregate"]:
        return "aggregate"

    def __repr__(self) -> str:
        return f"AggregatePolicy({self.reduction!r})"


PolicyLike = str | DecisionPolicy

_ALIASES: dict[str, DecisionPolicy] = {
    "all": AllRanks(),
    "any": AnyRank(),
    "majority": Majority(),
    "rank_zero": RankZero(),
    "mean": AggregatePolicy("mean"),
    "min": AggregatePolicy("min"),
    "max": AggregatePolicy("max"),
}


_QUORUM_NAME = re.compile(r"quorum_([1-9][0-9]?)")  # at least p% of the ranks, p from 1 to 99


def available_policies() -> list[str]:
    """The names :func:`resolve_policy` accepts.

    Example:
        >>> available_policies()
        ['all', 'any', 'majority', 'max', 'mean', 'min', 'rank_zero']

    """
    return sorted(_ALIASES)


def resolve_policy(policy: PolicyLike) -> DecisionPolicy:
    """Turn a policy name or object into a policy object.

    Args:
        policy: one of :func:`available_policies`, ``"quorum_<p>"`` (``Quorum(p / 100)``, at least p% of the ranks,
            p a whole number from 1 to 99), or a :class:`DecisionPolicy` instance such as ``Quorum(2)``.

    Raises:
        ValueError: an unknown name; the message lists the valid ones.
        TypeError: neither a name nor a policy object.

    Example:
        >>> resolve_policy("rank_zero")
        RankZero()
        >>> resolve_policy("quorum_75")
        Quorum(k=0.75)
        >>> resolve_policy("median")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: Unknown decision policy 'median'. Valid names: 'all', 'any', 'majority', 'max', ...
        >>> resolve_policy("majority").decide(VoteTally(yes=2, world_size=3, rank_zero=False))
        True
        >>> Quorum(2).decide(VoteTally(yes=1, world_size=4, rank_zero=True))
        False
        >>> resolve_policy("mean")
        AggregatePolicy('mean')

    """
    if isinstance(policy, DecisionPolicy):
        return policy
    if isinstance(policy, str):
        name = policy.strip().lower()
        found = _ALIASES.get(name)
        if found is None and (quorum := _QUORUM_NAME.fullmatch(name)) is not None:
            found = Quorum(int(quorum[1]) / 100)
        if found is None:
            names = ", ".join(repr(name) for name in available_policies())
            raise ValueError(
                f"Unknown decision policy {policy!r}. Valid names: {names}, 'quorum_<p>' for at least p% of the ranks"
                " (or a DecisionPolicy object such as Quorum(k))."
            )
        return found
    raise TypeError(f"A decision policy must be a name or a DecisionPolicy object, got {type(policy).__name__}")
