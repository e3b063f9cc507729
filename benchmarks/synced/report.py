"""The synced-logging benchmark's figures from rank 0's measurements: ratios to stock, collectives, the targets."""

import statistics
from typing import Any

from benchmarks.comm.report import median_interval
from benchmarks.helpers.host_syncs import HOST_SYNC

__all__ = ["LIMITS", "markdown", "summarize"]

LIMITS = {1: 0.95, 5: 0.6, 20: 0.35}  # the defaults' median step time against stock's, by synced values per step
CHECK = "check"  # lightning-ext's hang checks, on gloo groups of their own (not the training group)
NOT_CALLS = (CHECK, HOST_SYNC)  # counted per step beside the training group's calls


def _ratios(step_ns: dict[str, list[list[int]]], subject: str, stock: str) -> list[float]:
    """The ratio of ``subject``'s median step to ``stock``'s, round by round."""
    return [
        statistics.median(mine) / statistics.median(theirs)
        for mine, theirs in zip(step_ns[subject], step_ns[stock], strict=True)
    ]


def summarize(sessions: dict[int, dict[str, Any]], device: str = "cpu") -> dict[str, Any]:
    """``{"rows": [...], "targets": [...]}`` from each world size's measurements
    (:func:`benchmarks.synced.fits.measure`) on ``device``."""
    rows, targets = [], []
    for world_size, found in sorted(sessions.items()):
        for subject, steps in found["step_ns"].items():
            config, values = subject.split("/")
            ratios = _ratios(found["step_ns"], subject, f"stock/{values}")
            calls = found["collectives"][subject]
            rows.append(
                {
                    "world_size": world_size,
                    "values": int(values),
                    "config": config,
                    "step_ms": statistics.median(t for fit in steps for t in fit) / 1e6,
                    "ratio": {
                        "median": statistics.median(ratios),
                        "interval": list(median_interval(ratios)),
                        "low": min(ratios),
                        "high": max(ratios),
                    },
                    "training_group_calls": sum(n for op, n in calls.items() if op not in NOT_CALLS),
                    "checks": calls.get(CHECK, 0.0),
                    "host_syncs": calls.get(HOST_SYNC, 0.0),
                    "calls": {op: n for op, n in calls.items() if op != HOST_SYNC},
                }
            )
    for row in rows:
        if row["config"] != "defaults":
            continue
        where = f"W={row['world_size']}{' on cuda' if device == 'cuda' else ''}, {row['values']} synced value(s)"
        limit = LIMITS.get(row["values"])
        if limit is not None:
            value, interval = row["ratio"]["median"], row["ratio"]["interval"]
            targets.append({"name": "step time vs stock", "where": where, "limit": limit, "value": value,
                            "interval": interval, "met": value <= limit})  # fmt: skip
        calls = row["training_group_calls"]
        targets.append({"name": "training-group calls per step", "where": where, "limit": 1, "value": calls,
                        "met": calls <= 1})  # fmt: skip
    return {"rows": rows, "targets": targets}


def table(results: dict[str, Any]) -> str:
    """The Markdown table of every row: step time, ratio to stock, calls per step."""
    lines = [
        "| ranks | synced values | configuration | median step | ratio to stock (95% interval; lowest-highest round) |"
        " training-group calls per step | checks per step | host syncs per step |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in results["rows"]:
        ratio = row["ratio"]
        calls = ", ".join(f"{op} {n:g}" for op, n in row["calls"].items() if op != CHECK) or "none"
        lines.append(
            f"| {row['world_size']} | {row['values']} | `{row['config']}` | {row['step_ms']:.1f} ms"
            f" | {ratio['median']:.3f} ({_interval(ratio)}{ratio['low']:.2f}-{ratio['high']:.2f})"
            f" | {row['training_group_calls']:g} ({calls}) | {row['checks']:g} | {_host_syncs(row)} |"
        )
    return "\n".join(lines)


def _interval(ratio: dict[str, Any]) -> str:
    return f"{ratio['interval'][0]:.2f}-{ratio['interval'][1]:.2f}; " if "interval" in ratio else ""


def _settled(target: dict[str, Any]) -> str:
    """Whether the 95% interval settles a step-time target, where it does not (the verdict is the median's)."""
    low, high = target.get("interval", (target["value"], target["value"]))
    if low <= target["limit"] < high:
        return " by the median (the 95% interval reaches " + ("over" if target["met"] else "under") + " the limit)"
    return ""


def _host_syncs(row: dict[str, Any]) -> str:
    return f"{row['host_syncs']:g}" if "host_syncs" in row else "not counted"


def target_lines(results: dict[str, Any]) -> str:
    """One line per target: where, the figure, the limit, met or **missed**."""
    lines = []
    for target in results["targets"]:
        verdict = ("met" if target["met"] else "**missed**") + _settled(target)
        if target["name"].startswith("step"):
            low, high = target.get("interval", (target["value"], target["value"]))
            figure = f"{target['value']:.3f}x (95% interval {low:.2f}-{high:.2f})"
        else:
            figure = f"{target['value']:g}"
        lines.append(f"- {target['name']}, {target['where']}: {figure} (target ≤ {target['limit']:g}): {verdict}")
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """The results' Markdown page."""
    meta = results["metadata"]
    counts = meta["counts"]
    on_gpu = meta.get("device") == "cuda"
    ranks = "ranks sharing one GPU (NCCL at 1 rank, gloo at more)" if on_gpu else "gloo on CPU ranks"
    return (
        f"# Synced logging: coalesced against stock ({meta['machine']}, {meta['date'][:10]})\n\n"
        f"`python -m benchmarks.synced`{' --device cuda' * on_gpu}{' --smoke' if meta['smoke'] else ''}: {ranks},"
        f" {counts['repeats']} round(s) of {counts['steps']} timed steps per fit, every fit once per round in a"
        f" seeded random order; load average before: {meta['load_average_before']}; {meta['seconds']} s;"
        f" torch {meta['torch']}. Ratios are each round's median step against stock's in the same round: their median,"
        " with its 95% bootstrap interval over the rounds and the lowest and highest round.\n\n"
        f"{table(results)}\n\n## Targets (`defaults`)\n\n{target_lines(results)}\n"
    )
