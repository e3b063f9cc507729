"""``python -m benchmarks.fits.pitfall``: the founding pitfall at 32 ranks, launched as torchrun launches ranks.

Rank 0 alone logs a synced value under ``if self.trainer.is_global_zero:``. Every rank's error, its first line and the
time from rank 0's divergence to each rank's error are written to ``<out>/pitfall-<machine>.json`` and ``.md``; the
docs quote them (``python -m benchmarks.comm.figures``).
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.fits.__main__ import launch
from benchmarks.helpers.machine import cpu_machine, load_average

__all__ = ["main", "summarize"]


def summarize(found: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Every rank's error class and first line, grouped; the seconds from the divergence to the last error."""
    fits = [rank["fits"][0] for rank in found["ranks"]]
    diverged = fits[0]["diverged"]
    firsts = [fit.get("message", "").splitlines()[0] if fit.get("message") else "" for fit in fits]
    return {
        "world_size": world_size,
        "errors": sorted({fit.get("error") or "none" for fit in fits}),
        "same_message": len({fit.get("message") for fit in fits}) == 1,
        "first_line": firsts[0],
        "first_line_chars": len(firsts[0]),
        "ranks_with_that_first_line": sum(first == firsts[0] for first in firsts),
        "seconds_to_last_error": max(fit["at"] for fit in fits) - diverged,
        "seconds_to_first_error": min(fit["at"] for fit in fits) - diverged,
        "seconds_from_launch": max(fit["at"] for fit in fits) - found["launched"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fits.pitfall", description=__doc__)
    parser.add_argument("--world-size", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--machine", default=None)
    args = parser.parse_args(argv)
    started, before = time.time(), load_average()
    found = launch("pitfall", args.world_size, {"values": [1], "steps": 3, "skip": 0}, 600 + 30 * args.world_size)
    results = summarize(found, args.world_size)
    results["metadata"] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "machine": args.machine or cpu_machine(),
        "load_average": [before, load_average()],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"pitfall-{results['metadata']['machine']}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results))
    return 0


def markdown(results: dict[str, Any]) -> str:
    """The results' Markdown page."""
    meta = results["metadata"]
    return (
        f"# The founding pitfall at {results['world_size']} ranks ({meta['machine']}, {meta['date'][:10]})\n\n"
        f"`python -m benchmarks.fits.pitfall --world-size {results['world_size']}`; load average before and after:"
        f" {meta['load_average']}.\n\n"
        f"- error on every rank: {', '.join(results['errors'])}; the same message on every rank:"
        f" {results['same_message']}\n"
        f"- the first line ({results['first_line_chars']} characters, on {results['ranks_with_that_first_line']} of"
        f" {results['world_size']} ranks): `{results['first_line']}`\n"
        f"- from rank 0's divergence to the first rank's error {results['seconds_to_first_error']:.1f} s, to the last"
        f" rank's {results['seconds_to_last_error']:.1f} s; from the launch, {results['seconds_from_launch']:.0f} s\n"
    )


if __name__ == "__main__":
    sys.exit(main())
