"""The channel microbenchmark's figures: p50 and p99 of each subject, pooled over every rank, with intervals."""

import random
import statistics
from typing import Any

__all__ = ["markdown", "percentile", "summarize"]

_RESAMPLES = 400


def percentile(values: list[float], share: float) -> float:
    """The ``share`` quantile of ``values`` (nearest rank).

    >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5), percentile(list(range(100)), 0.99)
    (2.0, 98)
    """
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def _interval(rounds: list[list[float]], share: float, seed: int = 0) -> list[float]:
    """A 95% bootstrap interval of the ``share`` quantile, resampling whole rounds (each round pools every rank)."""
    draw = random.Random(seed)
    found = sorted(
        percentile([x for chosen in draw.choices(rounds, k=len(rounds)) for x in chosen], share)
        for _ in range(_RESAMPLES)
    )
    return [found[int(0.025 * _RESAMPLES)], found[int(0.975 * _RESAMPLES) - 1]]


def summarize(sessions: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """``{"rows": [...], "set_up": [...], "memory": [...]}`` from every rank's measurements by world size."""
    rows, set_up, memory = [], [], []
    for world_size, ranks in sorted(sessions.items()):
        for mode in ("idle", "busy"):
            for subject in ranks[0]["samples"][mode]:
                count = len(ranks[0]["samples"][mode][subject])
                rounds = [
                    [ns / 1000 for rank in ranks for ns in rank["samples"][mode][subject][number]]
                    for number in range(count)
                ]
                pooled = [x for one in rounds for x in one]
                spent = [ns / 1000 for rank in ranks for one in rank["cpu"][mode][subject] for ns in one]
                rows.append(
                    {
                        "world_size": world_size,
                        "busy": mode == "busy",
                        "subject": subject,
                        "p50_us": percentile(pooled, 0.5),
                        "p99_us": percentile(pooled, 0.99),
                        "p50_interval": _interval(rounds, 0.5),
                        "p99_interval": _interval(rounds, 0.99),
                        "cpu_p50_us": percentile(spent, 0.5),
                        "samples": len(pooled),
                    }
                )
        seconds = [rank["set_up_s"] for rank in ranks]
        set_up.append({"world_size": world_size, "median_s": statistics.median(seconds), "max_s": max(seconds)})
        anonymous = [rank["memory"]["anonymous"] for rank in ranks]
        memory.append(
            {"world_size": world_size, "per_rank_mib": statistics.median(anonymous), "total_mib": sum(anonymous)}
        )
    return {"rows": rows, "set_up": set_up, "memory": memory}


def table(results: dict[str, Any]) -> str:
    """p50 and p99 (µs) of every subject by world size, without and with the GIL-competing thread."""
    lines = [
        "| ranks | GIL-competing thread | subject | p50 (95% interval) | p99 (95% interval) | CPU p50 | samples |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for row in results["rows"]:
        low50, high50 = row["p50_interval"]
        low99, high99 = row["p99_interval"]
        lines.append(
            f"| {row['world_size']} | {'yes' if row['busy'] else 'no'} | `{row['subject']}`"
            f" | {row['p50_us']:,.0f} µs ({low50:,.0f}-{high50:,.0f}) | {row['p99_us']:,.0f} µs"
            f" ({low99:,.0f}-{high99:,.0f}) | {row['cpu_p50_us']:,.0f} µs | {row['samples']:,} |"
        )
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """The results' Markdown page."""
    meta = results["metadata"]
    counts = meta["counts"]
    set_up = ", ".join(
        f"W={row['world_size']}: {row['median_s']:.2f} s (max {row['max_s']:.2f})" for row in results["set_up"]
    )
    memory = ", ".join(f"W={row['world_size']}: {row['per_rank_mib']:.0f} MiB per rank" for row in results["memory"])
    return (
        f"# One hang check against barrier and all_reduce ({meta['machine']}, {meta['date'][:10]})\n\n"
        f"`python -m benchmarks.channel{' --smoke' if meta['smoke'] else ''}`: gloo on {meta['cpus']}-core CPU ranks,"
        f" {counts['rounds']} round(s) of {counts['calls']} calls per subject after {counts['warmup']} warm-up"
        f" round(s), the ranks lined up before each call; every rank's samples pooled; 95% intervals resample rounds."
        f" Load average before: {meta['load_average_before']}; after each world size:"
        f" {meta['load_average_after_each']}; {meta['seconds']} s; torch {meta['torch']}.\n\n"
        f"{table(results)}\n\nThe check's channel set up in (median over ranks): {set_up}.\n\n"
        f"Anonymous memory after the run: {memory}.\n"
    )
