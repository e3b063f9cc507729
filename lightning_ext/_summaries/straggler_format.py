"""The straggler verdict and the per-host memory check as text, JSON records or CSV."""

import math
from typing import Any

import pandas as pd

from lightning_ext._summaries.host_memory import HOST_SHARE
from lightning_ext._summaries.number_format import csv_text, duration, json_value, size, step_ranges
from lightning_ext._summaries.stragglers import CHRONIC, MIN_SHARE, PHASES

__all__ = [
    "RULE",
    "memory_lines",
    "stragglers_csv",
    "stragglers_records",
    "stragglers_text",
]

RULE = (
    "a straggler is a rank the others wait for: in a telemetry row it holds them back when their median wait exceeds"
    f" its own by at least {MIN_SHARE:.0%} of the step and its own time exceeds theirs by as much; it is named when"
    " what they lose so, as a share of their step time, exceeds what the other ranks cost them by at least"
    f" {MIN_SHARE:.0%}; chronic when it held them back in more than {CHRONIC:.0%} of its rows, otherwise in bursts"
)
_SPANS_SHOWN = 6
_NUMBERS = ("cost", "waited_s", "excess_s", "seconds", "others_s")


def stragglers_text(
    found: pd.DataFrame, medians: dict[str, float], hosts: pd.DataFrame, *, top: int, waits_measured: bool = True
) -> list[str]:
    """The verdict's lines: the median rank's time per batch by phase, the rule, then each straggler (``top`` of them).

    ``waits_measured``: whether the files hold ``gradient_wait_s`` (written before it, backward counts as waiting).
    """
    step = medians.get("step", math.nan)
    parts = [f"{phase} {duration(medians[phase])}" for phase in PHASES if phase in medians]
    parts.append(f"waiting for the others {duration(medians.get('waiting', math.nan))}")
    lines = [f"the median rank per batch: step {duration(step)} = " + " + ".join(parts)]
    lines.append(RULE)
    if not waits_measured:
        lines.append(
            "these files predate the measure of the gradient all-reduce's wait (telemetry/gradient_wait_s): backward"
            " counts as waiting, so a rank slow in its backward computation is not seen"
        )
    if found.empty:
        lines.append("no straggler: no rank held the others back")
        return lines
    rows = []
    for record in found.head(top).itertuples(index=False):
        when = "all along" if record.held == record.rows else f"steps {step_ranges(record.spans, shown=_SPANS_SHOWN)}"
        rows.append(
            {
                "rank": record.rank,
                "host": _host(hosts, record.rank),
                "phase": record.phase,
                "pattern": f"{record.pattern} ({record.held} of {record.rows} rows)",
                "extra per batch": f"+{duration(record.excess_s)} ({duration(record.seconds)} vs"
                f" {duration(record.others_s)})",
                "others lost": f"{record.cost:.0%}",
                "when": when if record.pattern == "bursts" else "",
            }
        )
    table = pd.DataFrame(rows)
    if not (table["when"] != "").any():
        table = table.drop(columns="when")
    lines.append(f"stragglers ({len(found)} rank(s)), the costliest first:")
    lines.append(table.to_string(index=False))
    if len(found) > top:
        lines.append(f"and {len(found) - top} more straggler(s) (--format json lists them all)")
    return lines


def memory_lines(memory: pd.DataFrame, *, most_loaded: bool = False) -> list[str]:
    """A warning per host whose ranks held more than half its memory (``most_loaded``: if none, the top host's line)."""
    shown = memory[memory["warn"]]
    if shown.empty and most_loaded:
        shown = memory.head(1)
    lines = []
    for record in shown.itertuples(index=False):
        biggest = f"process {size(record.biggest_rss)}, DataLoader workers {size(record.biggest_workers)}"
        line = (
            f"{'memory warning' if record.warn else 'memory, the most loaded host'}: host {record.host}: its"
            f" {record.ranks} rank(s) held {size(record.held)} of its {size(record.memory)} ({record.share:.0%}) at"
            f" step {record.step}; the biggest, rank {record.biggest_rank}, {size(record.biggest)} ({biggest})"
        )
        if record.warn:
            line += (
                f". Over {HOST_SHARE:.0%} of the host: if each rank holds its own copy of the data, load it once per"
                " host (shared or memory-mapped) or only each rank's shard"
            )
        lines.append(line)
    return lines


def stragglers_records(found: pd.DataFrame, hosts: pd.DataFrame) -> list[dict[str, Any]]:
    """One JSON-ready record per straggler of the verdict, with the rank's host (``null`` if unknown)."""
    return [
        {
            "rank": int(record.rank),
            "host": _host(hosts, record.rank, missing=None),
            "phase": record.phase,
            "pattern": record.pattern,
            **{name: json_value(float(getattr(record, name))) for name in _NUMBERS},
            "held": int(record.held),
            "rows": int(record.rows),
            "steps": [[int(first), int(last)] for first, last in record.spans],
        }
        for record in found.itertuples(index=False)
    ]


def stragglers_csv(found: pd.DataFrame, hosts: pd.DataFrame) -> str:
    """One CSV row per straggler of the verdict (the summaries' one rule for numbers: ``summary_format``)."""
    rows = [
        [record.rank, _host(hosts, record.rank, missing=None), record.phase, record.pattern]
        + [float(getattr(record, name)) for name in _NUMBERS]
        + [record.held, record.rows, step_ranges(record.spans)]
        for record in found.itertuples(index=False)
    ]
    return csv_text(["rank", "host", "phase", "pattern", *_NUMBERS, "held", "rows", "steps"], rows)


def _host(hosts: pd.DataFrame, rank: int, missing: Any = "-") -> Any:
    return str(hosts.at[rank, "host"]) if rank in hosts.index else missing
