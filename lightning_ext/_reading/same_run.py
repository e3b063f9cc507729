"""Whether the per-rank files under a log directory come from one run (``docs/per-rank-metrics.md``)."""

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from lightning_ext._rank_lists import ranks_text
from lightning_ext.errors import MixedRunsError

__all__ = ["RankInfo", "check_one_run", "check_rotations"]

_NAMED = 3  # files named per group in a message; the rest are counted
_FIX = (
    "Read the ranks of one run (read_rank_metrics(..., ranks=[...]), lightning-ext ranks --ranks ...) or move the other"
    " run's files away; allow_mixed=True (--allow-mixed) reads them anyway"
)


@dataclass(frozen=True)
class RankInfo:
    """One rank's file as read: its rows, first and last step, metric names (not ``step``/``epoch``), header."""

    file: str
    rows: int
    first_step: int | None
    last_step: int | None
    metrics: frozenset[str]
    has_header: bool


def check_rotations(files: Mapping[int, str], rotated: Mapping[int, list[str]], log_dir: str) -> None:
    """Rule 1: every rank's file was moved aside the same number of times (``rotated`` lists them, by number)."""
    generation = {rank: _number(rotated[rank][-1]) if rotated.get(rank) else 0 for rank in files}
    if len(set(generation.values())) < 2:
        return
    groups = []
    for count in sorted(set(generation.values()), reverse=True):
        ranks = [rank for rank in files if generation[rank] == count]
        if count:
            named = [rotated[rank][-1] for rank in ranks]
            groups.append(
                f"{ranks_text(ranks, None)} {_have(ranks)} earlier runs' files up to .{count} ({_names(named)})"
            )
        else:
            named = [files[rank] for rank in ranks]
            groups.append(
                f"{ranks_text(ranks, None)} {_have(ranks)} none, so their files may be an earlier run's"
                f" ({_names(named)})"
            )
    raise MixedRunsError(
        f"{log_dir} holds files of more than one run: a new run moves each rank's file aside (<file>.<n>), but "
        + "; ".join(groups)
        + f". {_FIX}"
    )


def check_one_run(ranks: Mapping[int, RankInfo], log_dir: str) -> None:
    """Rules 2 and 3: the ranks share metrics and their first step."""
    reasons = []
    sets = {rank: info.metrics for rank, info in ranks.items() if info.metrics and info.rows}
    if sets:
        common = Counter(sets.values()).most_common(1)[0][0]
        apart = [rank for rank, names in sets.items() if names.isdisjoint(common)]
        if apart:
            shared = [rank for rank, names in sets.items() if names == common]
            theirs, its = (_names(sorted(map(repr, names))) for names in (common, sets[apart[0]]))
            reasons.append(
                f"{_names([ranks[rank].file for rank in apart])} share no metric with {ranks_text(shared, None)}"
                f" (theirs: {theirs}; {its} in {ranks[apart[0]].file})"
            )
    firsts = {rank: info.first_step for rank, info in ranks.items() if info.first_step is not None}
    if firsts:
        common_first = Counter(firsts.values()).most_common(1)[0][0]
        apart = [rank for rank, step in firsts.items() if step != common_first]
        if apart:
            shared = [rank for rank, step in firsts.items() if step == common_first]
            starts = ", ".join(f"{ranks[rank].file} at step {firsts[rank]}" for rank in apart[:_NAMED])
            more = f" and {len(apart) - _NAMED} more" if len(apart) > _NAMED else ""
            reasons.append(
                f"{starts}{more} start(s) at another step than {ranks_text(shared, None)} (step {common_first})"
            )
    if reasons:
        raise MixedRunsError(f"{log_dir} holds files of more than one run: {'; '.join(reasons)}. {_FIX}")


def _number(path: str) -> int:
    return int(path.rsplit(".", 1)[1])


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_NAMED])
    return shown + (f" and {len(names) - _NAMED} more" if len(names) > _NAMED else "")


def _have(ranks: list[int]) -> str:
    return "has" if len(ranks) == 1 else "have"
