"""How every message names a set of ranks: runs as ranges, "and" before the last, the rest as a count; pure."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ranks_text"]


def ranks_text(ranks: Iterable[int], most: int | None = 4) -> str:
    """The ranks in as few words as it takes, closed by "and" so that a count or another list may follow them: ``rank
    3``, ``ranks 1-7``, ``ranks 0, 1 and 5``; beyond ``most`` runs of consecutive ranks (``None``: no limit), the rest
    as a count: ``ranks 0, 2, 4, 6 and 508 more``.

    Example:
        >>> ranks_text([3]), ranks_text(range(1, 8)), ranks_text([0, 1, 5]), ranks_text([0, 2, 6])
        ('rank 3', 'ranks 1-7', 'ranks 0, 1 and 5', 'ranks 0, 2 and 6')
        >>> ranks_text(range(0, 1024, 2)), ranks_text(range(0, 12, 2), most=None)
        ('ranks 0, 2, 4, 6 and 508 more', 'ranks 0, 2, 4, 6, 8 and 10')
        >>> f"4 batches on {ranks_text([0, 2, 6])} but 5 on {ranks_text([1])}"  # never read as ranks 0, 2, 6, 5
        '4 batches on ranks 0, 2 and 6 but 5 on rank 1'

    """
    ordered = sorted(set(ranks))
    if not ordered:
        return "no rank"
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    shown = [
        part
        for first, last in runs[:most]
        for part in ([f"{first}-{last}"] if last > first + 1 else dict.fromkeys((str(first), str(last))))
    ]
    rest = len(ordered) - sum(last - first + 1 for first, last in runs[:most])
    last = f"{rest} more" if rest else shown.pop()
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(shown) + (" and " if shown else "") + last
