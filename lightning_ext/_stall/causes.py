"""When the ranks have stalled, which rank is behind and why, and the report's text; pure, testable in one process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from lightning_ext._rank_lists import ranks_text
from lightning_ext._stall.rank_report import RankReport
from lightning_ext._watch.rank_text import call_text, doing, wait_text

__all__ = ["Thresholds", "is_stalled", "report_text", "summarize", "thresholds", "waits"]

_AUTO_MARGIN = timedelta(seconds=60)


@dataclass(frozen=True)
class Thresholds:
    """When a wait is reported, and whether the report ends the run.

    Attributes:
        report_after: seconds of waiting (and of no progress anywhere) before the report.
        ends: whether the report ends the run (``on_stall="error"``); if not, the run ends only when the waiting
            collective fails (at the backend's timeout).
        origin: how they were set, for people.
        group: the process group's timeout, in seconds.

    """

    report_after: float
    ends: bool
    origin: str
    group: float


def thresholds(stall_timeout: float | str, group_timeout: timedelta) -> Thresholds:
    """The thresholds of ``stall_timeout`` (seconds, or ``"auto"``) under a process group timeout ``group_timeout``.

    ``"auto"`` reports ``min(60 s, timeout / 10)`` before the process group's timeout and leaves the end to the
    backend: the waiting collective fails at its group's timeout, and that failure becomes the ``StallError``. So the
    default never ends a run that would have lived (a collective on a group with a longer timeout waits as long).

    Example:
        >>> limits = thresholds("auto", timedelta(minutes=30))
        >>> limits.report_after, limits.ends
        (1740.0, False)
        >>> thresholds("auto", timedelta(seconds=20)).report_after  # a tenth of a short timeout
        18.0
        >>> limits = thresholds(120, timedelta(minutes=30))
        >>> limits.report_after, limits.ends
        (120.0, True)

    """
    limit = group_timeout.total_seconds()
    if stall_timeout == "auto":
        margin = min(_AUTO_MARGIN.total_seconds(), limit / 10)
        origin = f"stall_timeout='auto': report {margin:g} s before the process group's timeout, end at it"
        return Thresholds(limit - margin, False, origin, limit)
    return Thresholds(float(stall_timeout), True, f"stall_timeout={stall_timeout!r}", limit)


def waits(report: RankReport, everyone: Sequence[RankReport]) -> float | None:
    """How long ``report``'s rank has waited for another rank (seconds), or ``None`` if it is not waiting for one.

    A collective call or a lightning-ext check is a wait; a backward pass whose gradients DDP all-reduces, or a DDP
    forward pass that broadcasts before its module runs, is one only while some other rank has not started that pass
    (its collective waits for that rank); otherwise it is computing.
    """
    if report.waiting is None or report.facts is None:
        return None
    kind, seconds = report.waiting
    if kind not in ("backward", "forward"):
        return seconds
    facts = report.facts
    number = facts.backward if kind == "backward" else facts.forward
    for other in everyone:
        if other.rank == report.rank:
            continue
        if other.facts is None:  # gone or silent: it has not come
            return seconds
        now, done = (
            (other.facts.backward, other.facts.backwards)
            if kind == "backward"
            else (other.facts.forward, other.facts.forwards)
        )
        if now != number and done < (number or 0):
            return seconds
    return None


def is_stalled(everyone: Sequence[RankReport], report_after: float) -> bool:
    """Whether the ranks have stalled: one has waited ``report_after`` seconds, and none has progressed for as long.

    A rank that did not answer makes no progress; a rank writing or loading a checkpoint always does.
    """
    if any(report.busy for report in everyone):
        return False
    progressed = [report.since_progress for report in everyone if report.facts is not None]
    if any(seconds is None or seconds < report_after for seconds in progressed):
        return False
    longest = [waits(report, everyone) for report in everyone]
    return any(seconds is not None and seconds >= report_after for seconds in longest)


def summarize(everyone: Sequence[RankReport], failed: dict[int, str] | None = None) -> tuple[str, list[int]]:
    """One sentence naming the rank(s) behind and the likely cause, and those ranks.

    ``failed``: the ranks whose collective call failed (a peer's process ended), with the error's first line.

    Example:
        >>> from lightning_ext._watch.rank_facts import Facts
        >>> waiting = RankReport(0, facts=Facts(0, backward=4, backwards=3), waiting=("backward", 130.0),
        ...                      since_progress=130.0)
        >>> computing = RankReport(1, facts=Facts(1, backwards=3, at="train.py:40 in training_step"),
        ...                        hook="training_step", since_progress=131.0)
        >>> sentence, behind = summarize([waiting, computing])
        >>> behind
        [1]
        >>> print(sentence)  # doctest: +NORMALIZE_WHITESPACE
        Rank 1 is behind: it has made no progress for 131 s, computing in training_step at train.py:40 in
        training_step; rank 0 waits for it in DDP's gradient all-reduce (synced backward pass #4) for 130 s.

    """
    waiting = [report for report in everyone if waits(report, everyone) is not None]
    failed = failed or {}
    gone = [report for report in everyone if report.facts is None]
    if gone:
        parts = [f"rank {report.rank} {_gone(report)}" for report in gone]
        return _sentence(parts, _tail(waiting, everyone, failed)), [report.rank for report in gone]
    odd = _odd_calls(everyone)
    if odd:
        parts = [
            f"rank {report.rank} is blocked in {_call_text(report)}, which {ranks_text(never)} never made"
            for report, never in odd
        ]
        others = [report for report in waiting if report not in [one for one, _ in odd]]
        return _sentence(parts, _tail(others, everyone, failed)), [report.rank for report, _ in odd]
    # a rank whose collective failed was waiting in it until then (its process group's timeout, reached before the
    # report under load): it is not behind, and the tail says where it failed
    behind = [report for report in everyone if waits(report, everyone) is None and report.rank not in failed]
    if behind and (waiting or failed):
        parts = [
            f"rank {report.rank} is behind: it has made no progress for {_seconds(report.since_progress)},"
            f" {_doing(report)}"
            for report in behind
        ]
        return _sentence(parts, _tail(waiting, everyone, failed)), [report.rank for report in behind]
    places = {_wait_text(report) for report in waiting}
    if len(places) == 1:
        return (
            f"Every rank waits in {places.pop()} and none is behind: the collective itself does not complete (the"
            " backend or the network is stuck).",
            [],
        )
    return _sentence(["the ranks wait in different collectives, which can never complete"], ""), []


def _sentence(parts: list[str], tail: str) -> str:
    text = "; ".join(parts) + (f"; {tail}" if tail else "") + "."
    return text[0].upper() + text[1:]


def _tail(waiting: Sequence[RankReport], everyone: Sequence[RankReport], failed: dict[int, str]) -> str:
    """``rank 0 waits for it in X for 130 s``, and which ranks' collective calls failed."""
    parts = [
        f"rank {report.rank} waits for it in {_wait_text(report)} for {_seconds(waits(report, everyone))}"
        for report in waiting
    ]
    ranks = {report.rank: report for report in everyone}
    for rank, text in sorted(failed.items()):
        parts.append(f"rank {rank}'s collective call failed{_during(ranks.get(rank))} ({text})")
    return "; ".join(parts)


def _during(report: RankReport | None) -> str:
    """`` in backward, during training of epoch 0 (...)``: where a rank was, in Lightning's terms (or nothing)."""
    progress = None if report is None or report.facts is None else report.facts.progress
    hook = f" in {report.hook}" if report is not None and report.hook else ""
    return hook + (f", during {progress.describe()}" if progress is not None else "")


def report_text(everyone: Sequence[RankReport], summary: str, header: Sequence[str]) -> str:
    """The report: a header, the summary, then each rank's section (place, wait, last call, logged keys, stacks)."""
    lines = ["=" * 100, *header, f"Summary: {summary}", ""]
    for report in sorted(everyone, key=lambda one: one.rank):
        lines.extend(_section(report, everyone))
    return "\n".join(lines) + "\n"


def _section(report: RankReport, everyone: Sequence[RankReport]) -> list[str]:
    title = f"--- rank {report.rank}" + (f" (pid {report.pid} on {report.host})" if report.pid else "")
    if report.facts is None:
        return [title, f"  {_gone(report)}", ""]
    facts = report.facts
    wait = waits(report, everyone)
    lines = [
        title,
        f"  where: {_place(report)}",
        f"  hook: {report.hook or 'none (between hooks)'}",
        "  waiting: "
        + (f"{_wait_text(report)} for {_seconds(wait)} (pending)" if wait is not None else "no: it runs its own code"),
        f"  last progress: {_seconds(report.since_progress)} ago" + (" (writing a checkpoint)" if report.busy else ""),
    ]
    if facts.inside is not None:
        lines.append(f"  collective call in progress: {_call_text(report)}")
    if report.last_call is not None:
        call = report.last_call
        done = "pending" if facts.inside is not None and facts.inside.index == call.index else "completed"
        lines.append(f"  last collective entered: {call_text(call)} ({done})")
    lines.append(f"  last logged: {', '.join(report.logged) or 'nothing this loop'}")
    if report.workers:
        lines.append(f"  dataloader workers: {'; '.join(report.workers)}")
    for name, stack in report.stacks:
        lines.append(f"  thread {name}:")
        lines.extend("    " + line for line in stack.rstrip().splitlines())
    lines.append("")
    return lines


def _place(report: RankReport) -> str:
    facts = report.facts
    progress = None if facts is None else facts.progress
    text = "unknown" if progress is None else progress.describe()
    if facts is not None and facts.at:
        text += f", at {facts.at}"
    return text


def _gone(report: RankReport) -> str:
    if report.state == "exited":
        return f"is gone: {report.detail or 'its process exited'}"
    return (
        "does not answer: its process may have died (on another host), or a C extension holds its Python interpreter"
        + (f" ({report.detail})" if report.detail else "")
    )


def _wait_text(report: RankReport) -> str:
    facts = report.facts
    if facts is None or report.waiting is None:
        return "nothing"
    return wait_text(report.waiting[0], facts)


def _call_text(report: RankReport) -> str:
    inside = None if report.facts is None else report.facts.inside
    return "a collective call" if inside is None else call_text(inside)


def _odd_calls(everyone: Sequence[RankReport]) -> list[tuple[RankReport, list[int]]]:
    """Ranks inside a collective call that other ranks never made: their count on its group is short of its number,
    and they wait elsewhere (a rank that computes has not made it yet: it is behind, not waiting)."""
    found = []
    for report in everyone:
        inside = None if report.facts is None else report.facts.inside
        if inside is None:
            continue
        short = [
            other
            for other in everyone
            if other.facts is not None
            and other.rank != report.rank
            and other.facts.counts.get(inside.group, 0) < inside.index
        ]
        if short and all(waits(other, everyone) is not None for other in short):
            found.append((report, [other.rank for other in short]))
    return found


def _doing(report: RankReport) -> str:
    """``computing in training_step at model.py:40 in training_step, during training of epoch 0 (...)``."""
    stack = report.stacks[0][1] if report.stacks else ""
    return doing(report.facts, report.hook, stack, report.workers)


def _seconds(value: float | None) -> str:
    return "an unknown time" if value is None else f"{value:.0f} s"
