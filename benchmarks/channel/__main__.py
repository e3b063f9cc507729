"""``python -m benchmarks.channel``: one hang check against ``barrier`` and a one-element ``all_reduce``, on gloo.

For each world size (default 2 4 8 16 32; gloo on CPU ranks it spawns on this machine), every rank times each
subject of :mod:`benchmarks.channel.rank` call by call, without and with a thread that competes for the GIL; the
parent pools every rank's samples into p50 and p99 with 95% intervals (rounds resampled). Writes
``<out>/channel-<machine>.json`` and ``.md``. ``--smoke`` runs a few calls at 2 ranks (CI). See benchmarks/README.md.
"""

import argparse
import json
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.spawn import start_processes

from benchmarks.channel.rank import rank_main
from benchmarks.channel.report import markdown, summarize
from benchmarks.helpers.machine import cpu_machine, load_average

__all__ = ["main"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _session(world_size: int, counts: dict[str, int], timeout_s: float) -> list[dict[str, Any]]:
    """Every rank's measurements at ``world_size``, in rank order."""
    with tempfile.TemporaryDirectory(prefix="channel-bench-") as work:
        start: Callable[..., Any] = start_processes  # untyped in torch
        args = (world_size, _free_port(), counts, work)
        context = start(rank_main, args=args, nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"W={world_size}: no result within {timeout_s:.0f} s; the ranks were killed")
        return [json.loads(Path(work, f"rank-{rank}.json").read_text()) for rank in range(world_size)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.channel", description=__doc__)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (every subject in each, seeded order)")
    parser.add_argument("--calls", type=int, default=20, help="timed calls per subject per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--smoke", action="store_true", help="a few calls at 2 ranks: does it run (CI)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--machine", default=None, help="the results' file name part (default: this machine's)")
    args = parser.parse_args(argv)
    world_sizes = [2] if args.smoke else args.world_sizes
    counts = {"rounds": 2, "calls": 3, "warmup": 0} if args.smoke else vars(args)
    counts = {key: int(counts[key]) for key in ("rounds", "calls", "warmup")} | {"seed": args.seed}
    started, before = time.time(), load_average()
    sessions, loads = {}, {}
    for world_size in world_sizes:
        print(f"W={world_size}: load average {load_average()} ...", flush=True)
        timeout_s = 600 + 2.0 * world_size * (counts["rounds"] + counts["warmup"]) * counts["calls"]
        sessions[world_size] = _session(world_size, counts, timeout_s)
        loads[world_size] = load_average()
    results = summarize(sessions)
    results["metadata"] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started),
        "machine": args.machine or cpu_machine(),
        "cpus": __import__("os").cpu_count(),
        "load_average_before": before,
        "load_average_after_each": {str(size): load for size, load in loads.items()},
        "counts": counts | {"world_sizes": world_sizes},
        "smoke": args.smoke,
        "torch": torch.__version__,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"channel-{results['metadata']['machine']}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    page = markdown(results)
    stem.with_suffix(".md").write_text(page, encoding="utf-8")
    print(page)
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
