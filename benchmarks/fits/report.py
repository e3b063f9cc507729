"""The launched fits' figures: set-up to the first batch and the step, each a ratio to stock within a repeat."""

import statistics
from typing import Any

from benchmarks.comm.report import median_interval

__all__ = ["REFERENCES", "SET_UP_LIMIT", "markdown", "summarize"]

SET_UP_LIMIT: dict[int, float] = {
    16: 1.1,
    32: 1.1,
}  # set-up to the first batch against stock's, by world size (issue 39)
# the step against stock's that the defaults must stay at or under, by (world size, synced values): the values riding
# the check (benchmarks/results/synced-cpu-2core-x86_64.md, 2026-11-27) at 2 and 4 ranks; issue 39's figures at 8, 16
REFERENCES: dict[tuple[int, int], float] = {
    (2, 1): 0.848, (2, 5): 0.452, (2, 20): 0.292,
    (4, 1): 0.919, (4, 5): 0.502, (4, 20): 0.294,
    (8, 5): 0.41, (16, 5): 0.54,
}  # fmt: skip
_SPENT = {  # a part of set-up: the name its time is kept under (benchmarks/fits/rank.py)
    "process group": "setup_environment",
    "agree": "agree",
    "HangGuard.start": "start",
    "open_channel": "open_channel",
    "CheckChannel.__init__": "CheckChannel.__init__",
    "Watchdog.__init__": "Watchdog.__init__",
    "monitor.start": "monitor.start",
}


def _set_up_s(launch: dict[str, Any]) -> float:
    """From the launch to the last rank's first batch of its first fit, in seconds."""
    return float(max(rank["fits"][0]["first_batch"] for rank in launch["ranks"]) - launch["launched"])


def _parts(launch: dict[str, Any]) -> dict[str, float]:
    """The slowest rank's seconds in each part of set-up (imports: from the launch to the imports' end)."""
    ranks = launch["ranks"]
    found = {"imports": max(rank["imported"] for rank in ranks) - launch["launched"]}
    for part, name in _SPENT.items():
        if all(name in rank["spent"] for rank in ranks):
            found[part] = max(rank["spent"][name] for rank in ranks)
    return found


def _ratio(mine: list[float], theirs: list[float]) -> dict[str, Any]:
    ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
    return {"median": statistics.median(ratios), "interval": list(median_interval(ratios)), "low": min(ratios),
            "high": max(ratios), "repeats": len(ratios)}  # fmt: skip


def summarize(sessions: dict[int, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """``{"set_up": [...], "steps": [...], "targets": [...]}`` from every launch, by world size and configuration."""
    set_up: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for size, configs in sorted(sessions.items()):
        seconds = {config: [_set_up_s(launch) for launch in launches] for config, launches in configs.items()}
        for config, launches in configs.items():
            parts = [_parts(launch) for launch in launches]
            set_up.append(
                {
                    "world_size": size,
                    "config": config,
                    "seconds": statistics.median(seconds[config]),
                    "ratio": _ratio(seconds[config], seconds["stock"]),
                    "parts": {part: statistics.median(p[part] for p in parts) for part in parts[0]},
                }
            )
        values = [fit["values"] for fit in configs["stock"][0]["ranks"][0]["fits"]]
        for index, count in enumerate(values):
            medians = {
                config: [statistics.median(launch["ranks"][0]["fits"][index]["step_ns"]) / 1e6 for launch in launches]
                for config, launches in configs.items()
            }
            for config in configs:
                steps.append(
                    {
                        "world_size": size,
                        "values": count,
                        "config": config,
                        "step_ms": statistics.median(medians[config]),
                        "ratio": _ratio(medians[config], medians["stock"]),
                        "over_floor": _ratio(medians[config], medians["unsynced"]),
                    }
                )
    for row in set_up:
        limit = SET_UP_LIMIT.get(row["world_size"])
        if row["config"] == "defaults" and limit is not None:
            targets.append(_target("set-up to the first batch vs stock", row, limit))
    for row in steps:
        limit = REFERENCES.get((row["world_size"], row["values"]))
        if row["config"] == "defaults" and limit is not None:
            targets.append(_target(f"step vs stock, {row['values']} synced value(s)", row, limit))
    return {"set_up": set_up, "steps": steps, "targets": targets}


def _target(name: str, row: dict[str, Any], limit: float) -> dict[str, Any]:
    ratio = row["ratio"]
    return {"name": name, "world_size": row["world_size"], "limit": limit, "value": ratio["median"],
            "interval": ratio["interval"], "met": ratio["median"] <= limit}  # fmt: skip


def _cell(ratio: dict[str, Any]) -> str:
    low, high = ratio["interval"]
    return f"{ratio['median']:.2f} ({low:.2f}-{high:.2f})"


def set_up_table(results: dict[str, Any]) -> str:
    """Set-up to the first batch by world size and configuration, with the parts of the slowest rank."""
    lines = [
        "| ranks | configuration | set-up | ratio to stock (95% interval) | imports | process group |"
        " lightning-ext: agreement, checks' channel, watchdog | repeats |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["set_up"]:
        parts = row["parts"]
        channel = parts.get("open_channel", parts.get("CheckChannel.__init__"))
        ours = ", ".join(
            f"{value:.2f}"
            for value in (parts.get("agree"), channel, parts.get("Watchdog.__init__"))
            if value is not None
        )
        lines.append(
            f"| {row['world_size']} | `{row['config']}` | {row['seconds']:.1f} s | {_cell(row['ratio'])}"
            f" | {parts['imports']:.1f} s | {parts.get('process group', 0.0):.2f} s | {ours or '-'} |"
            f" {row['ratio']['repeats']} |"
        )
    return "\n".join(lines)


def step_table(results: dict[str, Any]) -> str:
    """The median step by world size, synced values and configuration; ratios to stock and to the unsynced floor."""
    lines = [
        "| ranks | synced values | configuration | median step | ratio to stock (95% interval) |"
        " ratio to the unsynced floor |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for row in results["steps"]:
        lines.append(
            f"| {row['world_size']} | {row['values']} | `{row['config']}` | {row['step_ms']:.1f} ms"
            f" | {_cell(row['ratio'])} | {_cell(row['over_floor'])} |"
        )
    return "\n".join(lines)


def target_lines(results: dict[str, Any]) -> str:
    """One line per target: where, the figure, the limit, met or **missed**."""
    lines = []
    for target in results["targets"]:
        low, high = target["interval"]
        verdict = "met" if target["met"] else "**missed**"
        if low <= target["limit"] < high:
            verdict += " by the median (the 95% interval reaches " + ("over" if target["met"] else "under") + " it)"
        lines.append(
            f"- {target['name']}, W={target['world_size']}: {target['value']:.2f}x (95% interval {low:.2f}-{high:.2f})"
            f" (target ≤ {target['limit']:g}): {verdict}"
        )
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """The results' Markdown page."""
    meta = results["metadata"]
    counts = meta["counts"]
    return (
        f"# Launched fits: set-up and step against stock ({meta['machine']}, {meta['date'][:10]})\n\n"
        f"`python -m benchmarks.fits{' --smoke' if meta['smoke'] else ''}`: gloo on {meta['cpus']}-core CPU ranks,"
        f" world sizes {counts['world_sizes']}, every configuration launched once per repeat in a seeded random order"
        f" (repeats by world size: {counts['repeats']}); each launch fits {counts['values']} synced values per step,"
        f" {counts['steps']} timed steps after {counts['skip']}. Load average before and after each world size:"
        f" {meta['load_average']}; waited for memory: {meta['waited_for_memory_s']} s; {meta['seconds']} s in all;"
        f" torch {meta['torch']}.\n\n"
        f"## Set-up to the first batch\n\n{set_up_table(results)}\n\n## The step\n\n{step_table(results)}\n\n"
        f"## Targets (`defaults`)\n\n{target_lines(results)}\n"
    )
