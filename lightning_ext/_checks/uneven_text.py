"""The uneven-data messages' text: which rank's loader ran out first, and each rank's batches; pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_ext._checks.points import Point
from lightning_ext._watch.progress import Progress
from lightning_ext._watch.rank_text import grouped_lines, ranks_text

__all__ = ["count_text", "loaders_headline", "uneven"]


def uneven(progress: Sequence[Progress | None]) -> tuple[str, list[str]] | None:
    """The headline and detail lines when some rank's data ran out before the others', from each rank's progress.

    The culprit is a rank whose loader ended with fewer batches than another's ended with, or one that is known to
    have more (a rank that has not run out after as many batches: Lightning fetches one batch ahead); a rank that is
    only behind in time is never named.
    """
    known = [(rank, p) for rank, p in enumerate(progress) if p is not None]
    if len(known) < 2:
        return None
    if len({p.epoch for _, p in known}) == 1:
        # ran out: not merely elsewhere (a sanity check, a validation in the middle of the epoch)
        ended = {rank: p.train_batches for rank, p in known if p.train_done}
        going = {rank: p.train_batches for rank, p in known if p.stage == "train" and not p.train_done}
        fewest = min(ended.values(), default=0)
        more = [rank for rank, count in going.items() if ended and count >= fewest]
        if ended and (more or len(set(ended.values())) > 1):
            short = [rank for rank, count in ended.items() if count == fewest]
            longest = max(ended.values())
            if longest > fewest:
                other = f"but after {longest} on {ranks_text([r for r, c in ended.items() if c == longest], 3)}"
            else:
                other = f"while {ranks_text(more, 3)} had more"
            head = (
                f"Uneven data in epoch {known[0][1].epoch}: the train dataloader ran out after {fewest} batch(es) on"
                f" {ranks_text(short, 3)} {other}."
            )
            return head, grouped_lines((rank, _train_progress(p)) for rank, p in known)
    # the ranks' evaluation runs: a rank with no batches counted there is elsewhere (after the sanity check, whose
    # counts are reset), so is a rank in the sanity check while another is not
    known = [(rank, p) for rank, p in known if p.eval_batches]
    if len(known) < 2 or len({(p.epoch, p.eval_loader, p.stage == "sanity_check") for _, p in known}) > 1:
        return None
    loader = known[0][1].eval_loader
    for index in range(max(len(p.eval_batches) for _, p in known)):
        counts = [(rank, p.eval_batches[index] if index < len(p.eval_batches) else 0, p) for rank, p in known]
        fewest = min(count for _, count, _ in counts)
        short = [rank for rank, count, p in counts if count == fewest and p.eval_done]
        more = [rank for rank, count, _ in counts if count > fewest]
        if short and more:
            head = (
                f"Uneven data: the {loader} dataloader {index} ran out after {fewest} batch(es) on"
                f" {ranks_text(short, 3)} while {ranks_text(more, 3)} had more."
            )
            lines = grouped_lines(
                (rank, f"{count} batch(es)" + (", ran out" if p.eval_done else ", more to come"))
                for rank, count, p in counts
            )
            return head, lines
    return None


def _train_progress(progress: Progress) -> str:
    if progress.train_done:
        return f"ran out after {progress.train_batches} training batch(es)"
    if progress.stage == "train":
        return f"{progress.train_batches} training batch(es) so far, and more to come"
    return progress.describe()


def loaders_headline(points: Sequence[Point]) -> tuple[str, list[str]]:
    details: list[Any] = [point.detail for point in points]
    stage = details[0]["stage"]
    names = details[0]["names"]
    if any(detail["stage"] != stage or detail["names"] != names for detail in details):
        return "The ranks set up different dataloaders.", grouped_lines(
            (rank, point.where) for rank, point in enumerate(points)
        )
    parts = []
    for position, name in enumerate(names):
        by_count: dict[float, list[int]] = {}
        for rank, detail in enumerate(details):
            by_count.setdefault(detail["counts"][position], []).append(rank)
        if len(by_count) > 1:
            ordered = sorted(by_count.items())
            shown = [f"{_batches(count) if index == 0 else count_text(count)} on {ranks_text(ranks, 2)}"
                     for index, (count, ranks) in enumerate(ordered[:2])]  # fmt: skip
            rest = sum(len(ranks) for _, ranks in ordered[2:])
            parts.append(
                f"the {name} has {', '.join(shown)}" + (f", other counts on {rest} more ranks" if rest else "")
            )
    more = f"; and {len(parts) - 1} more dataloader(s)" if len(parts) > 1 else ""
    lines = grouped_lines(
        (rank, ", ".join(f"{name}: {_batches(count)}" for name, count in zip(names, detail["counts"], strict=True)))
        for rank, detail in enumerate(details)
    )
    return f"Uneven data in {stage}: {parts[0]}{more}.", lines


def _batches(count: float) -> str:
    return "no length" if count == float("inf") else f"{int(count)} batch" + ("" if count == 1 else "es")


def count_text(count: float) -> str:
    """A batch count for people: ``"no length"`` for a loader without one."""
    return "no length" if count == float("inf") else str(int(count))
