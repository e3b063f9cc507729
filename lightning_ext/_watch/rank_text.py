"""How the hang checks and the stall report say things: lines grouped by rank, sites, calls, what a rank does; pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from lightning_ext._rank_lists import ranks_text
from lightning_ext._watch.rank_facts import WORLD, Call, Facts

__all__ = [
    "DETAIL_GROUPS",
    "FIRST_LINE",
    "backward_text",
    "call_text",
    "doing",
    "grouped_lines",
    "short_site",
    "shortened",
    "wait_text",
]

FIRST_LINE = 200  # characters: a first line stays under this at any world size
DETAIL_GROUPS = 8  # detail lines: at most this many groups of ranks, then one line for the rest
_SITE = re.compile(r"^(?P<path>.+):(?P<line>\d+)(?: in .*)?$")


def grouped_lines(items: Iterable[tuple[int, str]], most: int = DETAIL_GROUPS) -> list[str]:
    """One line per distinct text, naming the ranks it holds for (``  ranks 1-7: went on to ...``), in rank order;
    beyond ``most`` groups, one line for the rest."""
    groups: dict[str, list[int]] = {}
    for rank, text in items:
        groups.setdefault(text, []).append(rank)
    ordered = sorted(groups.items(), key=lambda group: min(group[1]))
    lines = [f"  {ranks_text(ranks)}: {text}" for text, ranks in ordered[:most]]
    rest = [rank for _, ranks in ordered[most:] for rank in ranks]
    if rest:
        lines.append(f"  and {len(rest)} more rank(s) ({ranks_text(rest)}), elsewhere in {len(ordered) - most} ways")
    return lines


def short_site(site: str | None, longest: int = 40) -> str:
    """``train.py:31`` from ``/home/me/project/train.py:31 in training_step``: the file's name and the line."""
    if not site:
        return "an unknown line"
    found = _SITE.match(site)
    if found is None:
        return shortened(site, longest)
    name = found["path"].replace("\\", "/").rsplit("/", 1)[-1]
    return f"{shortened(name, longest)}:{found['line']}"


def shortened(text: str, longest: int) -> str:
    """``text``, cut to ``longest`` characters with an ellipsis where it is longer."""
    return text if len(text) <= longest else text[: longest - 3] + "..."


def _group_text(name: str) -> str:
    """``the default group`` or ``process group 'tp'``: a counted call's process group, for people."""
    return "the default group" if name == WORLD else f"process group {name!r}"


def call_text(call: Call) -> str:
    """``torch.distributed.all_reduce called from train.py:42 in training_step (its call #3 on the default group)``."""
    return f"{call.name} called from {call.site} (its call #{call.index} on {_group_text(call.group)})"


def backward_text(number: int | None) -> str:
    """``DDP's gradient all-reduce (synced backward pass #4)``: where a rank in a synced backward pass waits."""
    return f"DDP's gradient all-reduce (synced backward pass #{number})"


def wait_text(kind: str, facts: Facts) -> str:
    """What a rank waits in, for people (the checks' messages and the stall report word it alike): ``kind`` is
    ``"collective"`` (the counted call it is inside: :func:`call_text`), ``"check"`` (a lightning-ext check) or
    ``"backward"`` (:func:`backward_text`)."""
    if kind == "collective" and facts.inside is not None:
        return call_text(facts.inside)
    if kind == "check" and facts.check is not None:
        return f"lightning-ext's check before {facts.check[1]}"
    return backward_text(facts.backward)


def doing(facts: Facts | None, hook: str | None = None, stack: str = "", workers: Sequence[str] = ()) -> str:
    """What a rank is doing, from its facts (and, in a stall report, its training thread's stack and its DataLoader
    workers): ``blocked in ...``, ``in its synced backward pass #4 ...``, ``computing in training_step at ...``,
    followed by where it is in Lightning's loops. ``hook``: the hook it runs, if not the one in its facts."""
    progress = None if facts is None else facts.progress
    hook = hook or (None if progress is None else progress.hook)
    during = f", during {progress.describe()}" if progress is not None else ""
    in_hook = f" in {hook}" if hook else ""
    at = f" at {facts.at}" if facts is not None and facts.at else ""
    if facts is not None and facts.inside is not None:
        return f"blocked in {call_text(facts.inside)}{during}"
    if facts is not None and facts.backward is not None:
        return f"in {backward_text(facts.backward)}{in_hook}{at}{during}"
    if "torch/utils/data/dataloader.py" in stack and "_get_data" in stack:
        listed = f" ({'; '.join(workers)})" if workers else ""
        return f"waiting for a batch from its DataLoader worker process(es){listed}{during}"
    blocked = re.findall(r'torch/distributed/distributed_c10d\.py", line \d+, in (\w+)', stack)
    if blocked:
        return (
            f"blocked in torch.distributed.{blocked[-1]}{in_hook}{at} (a call lightning-ext does not count: point to"
            f" point, or on a group of some ranks only){during}"
        )
    if "synchronize" in stack and "torch/cuda" in stack:
        return f"waiting for the GPU (torch.cuda.synchronize){in_hook}{at}{during}"
    return f"computing{in_hook}{at}{during}"
