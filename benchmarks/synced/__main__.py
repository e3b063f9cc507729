"""``python -m benchmarks.synced``: the coalesced synced logging against stock Lightning's sync per value.

For each world size (gloo on CPU ranks it launches itself; with ``--device cuda``, ranks sharing the one GPU),
every configuration of :mod:`benchmarks.synced.fits` at 1, 5 and 20 synced values per step: the step time as a ratio
to stock's in the same round (median over the rounds, with the lowest and highest), and the ``torch.distributed``
calls and host-device synchronizations per step. Writes ``<out>/synced-<machine>.json`` and ``.md`` and prints the
table and the targets. ``--smoke`` runs a few steps once (CI). See ``benchmarks/README.md``.
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

from benchmarks.helpers.machine import cpu_machine, default_machine, load_average
from benchmarks.synced.fits import backend, rank_main
from benchmarks.synced.report import markdown, summarize

__all__ = ["main"]


def _session(
    world_size: int, values: list[int], steps: int, repeats: int, timeout_s: float, device: str
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="synced-bench-") as work, socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        args = (world_size, port, values, steps, repeats, work, device)
        start: Callable[..., Any] = start_processes  # untyped in torch
        context = start(rank_main, args=args, nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"W={world_size}: no result within {timeout_s:.0f} s; the ranks were killed")
        found: dict[str, Any] = json.loads(Path(work, "found.json").read_text())
        return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.synced", description=__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: ranks sharing one GPU")
    parser.add_argument("--world-sizes", type=int, nargs="+", help="default: 2 4 on CPU, 1 2 on the GPU")
    parser.add_argument("--values", type=int, nargs="+", default=[1, 5, 20], help="synced values per step")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per fit")
    parser.add_argument("--repeats", type=int, default=12, help="timed rounds (every fit once per round)")
    parser.add_argument("--smoke", action="store_true", help="a few steps, one round: does it run (CI)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--machine", default=None, help="the results' file name part (default: this machine's)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False here (a CUDA build of torch and a GPU needed)")
    world_sizes = args.world_sizes or ([1, 2] if args.device == "cuda" else [2, 4])
    steps, repeats = (4, 1) if args.smoke else (args.steps, args.repeats)
    started, load = time.time(), load_average()
    sessions = {}
    for world_size in world_sizes:
        timeout_s = 300 + 5 * len(args.values) * (1 + repeats) * (steps + 10) * world_size
        group = f"{backend(args.device, world_size)}/{args.device}"
        print(f"W={world_size} ({group}): {len(args.values) * 5} fits per round, {repeats} round(s) ...", flush=True)
        sessions[world_size] = _session(world_size, args.values, steps, repeats, timeout_s, args.device)
    results = summarize(sessions, args.device)
    machine = args.machine or (default_machine() if args.device == "cuda" else cpu_machine())
    results["metadata"] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started),
        "machine": machine,
        "device": args.device,
        "load_average_before": load,
        "counts": {"steps": steps, "repeats": repeats, "values": args.values, "world_sizes": world_sizes},
        "smoke": args.smoke,
        "torch": torch.__version__,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"synced-{results['metadata']['machine']}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    page = markdown(results)
    stem.with_suffix(".md").write_text(page, encoding="utf-8")
    print(page)
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
