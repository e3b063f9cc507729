"""The straggler verdict and the per-host memory check as text, JSON records or CSV.

Example:
    >>> print(duration(0.0423), duration(2.5e-5), size(3 * 2**30))
    42.3 ms 25 µs 3 GiB
"""

import math
from typing import Any

import pandas as pd

from lightning_ext._per_rank.host_memory import HOST_SHARE
from lightning_ext._per_rank.spread import OUTLIER
from lightning_ext._per_rank.stragglers import MIN_SHARE
from lightning_ext._per_rank.summary_format import csv_text, json_value

__all__ = ["RULE", "duration", "memory_lines", "size", "stragglers_csv", "stragglers_records", "stragglers_text"]

RULE = (
    f"a rank is a straggler in a phase when its median time per batch there has robust z > {OUTLIER:g} among the"
    f" ranks and exceeds their median by at least {MIN_SHARE:.0%} of the median step"
)
_PHASE_ORDER = ("step", "data wait", "forward", "optimizer")


def duration(seconds: float) -> str:
    """``seconds`` in s, ms or µs, 3 significant digits."""
    if math.isnan(seconds):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-6:.3g} µs"


def size(count: float) -> str:
    """``count`` bytes in GiB, MiB, KiB or B, 3 significant digits."""
    if math.isnan(count):
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


def stragglers_text(found: pd.DataFrame, medians: dict[str, float], hosts: pd.DataFrame, *, top: int) -> list[str]:
    """The verdict's lines: the median rank's time per batch by phase, then each straggler (``top`` per phase)."""
    step = medians.get("step", math.nan)
    parts = [f"{phase} {duration(seconds)}" for phase, seconds in medians.items() if phase != "step"]
    other = step - sum(seconds for phase, seconds in medians.items() if phase != "step")
    lines = [f"the median rank per batch: step {duration(step)} = " + " + ".join([*parts, f"other {duration(other)}"])]
    lines.append(RULE)
    if found.empty:
        lines.append("no straggler: no rank stands out in " + ", ".join(_PHASE_ORDER[:-1]) + " or optimizer time")
        return lines
    rows, more = [], []
    for phase in _PHASE_ORDER:
        flagged = found[found["phase"] == phase]
        for record in flagged.head(top).itertuples(index=False):
            rows.append(
                {
                    "rank": record.rank,
                    "host": _host(hosts, record.rank),
                    "phase": phase,
                    "per batch": duration(record.seconds),
                    "ranks' median": duration(record.median),
                    "slower by": f"{record.ratio:.3g}x, +{duration(record.excess_s)}",
                    "robust z": f"{record.robust_z:+.3g}",
                }
            )
        if len(flagged) > top:
            more.append(f"and {len(flagged) - top} more rank(s) in {phase} (--format json lists them all)")
    lines.append(f"stragglers ({found['rank'].nunique()} rank(s)):")
    lines.append(pd.DataFrame(rows).to_string(index=False))
    return lines + more


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
    """One JSON-ready record per (rank, phase) of the verdict, with the rank's host (``null`` if unknown)."""
    return [
        {
            "rank": int(record.rank),
            "host": _host(hosts, record.rank, missing=None),
            "phase": record.phase,
            **{name: json_value(float(getattr(record, name))) for name in _NUMBERS},
            "samples": int(record.samples),
        }
        for record in found.itertuples(index=False)
    ]


def stragglers_csv(found: pd.DataFrame, hosts: pd.DataFrame) -> str:
    """One CSV row per (rank, phase) of the verdict (the summaries' one rule for numbers: ``summary_format``)."""
    rows = [
        [record.rank, _host(hosts, record.rank, missing=None), record.phase]
        + [float(getattr(record, name)) for name in _NUMBERS]
        + [record.samples]
        for record in found.itertuples(index=False)
    ]
    return csv_text(["rank", "host", "phase", *_NUMBERS, "samples"], rows)


_NUMBERS = ("seconds", "median", "ratio", "excess_s", "share", "robust_z")


def _host(hosts: pd.DataFrame, rank: int, missing: Any = "-") -> Any:
    return str(hosts.at[rank, "host"]) if rank in hosts.index else missing
