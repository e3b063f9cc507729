"""``python -m benchmarks.fits``: launched fits, stock against lightning-ext's defaults, at 2 to 32 ranks.

Each repeat launches every configuration once, in a seeded random order: ``world_size`` fresh processes, started as
torchrun starts them (gloo on CPU ranks on this machine), each running :mod:`benchmarks.fits.rank`: a fit per number
of synced values per step. Set-up is the time from the launch to the last rank's first batch of its first fit; a step
is rank 0's median step of each fit. Ratios are taken within each repeat; their median carries a 95% bootstrap
interval. Writes ``<out>/fits-<machine>.json`` and ``.md``; ``--smoke``: one small launch (CI). benchmarks/README.md.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from benchmarks.fits.report import markdown, summarize
from benchmarks.helpers.machine import cpu_machine, load_average

__all__ = ["CONFIGS", "main"]

CONFIGS = ("stock", "defaults", "unsynced")
_MEMORY_PER_RANK = 450 * 2**20  # bytes a rank may need here (torch, Lightning, the fit): the launch waits for them


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def launch(config: str, world_size: int, plan: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Launch ``world_size`` ranks of ``config``; every rank's measurements and the launch's start time."""
    with tempfile.TemporaryDirectory(prefix="fits-bench-") as work:
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(Path.cwd()), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size), NODE_RANK="0")
        command = [sys.executable, "-m", "benchmarks.fits.rank", config, json.dumps(plan), work]
        started = time.time()
        processes = [
            subprocess.Popen(
                command,
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(work, f"err-{rank}.log"), "w"),  # noqa: SIM115 (closed with the process)
            )
            for rank in range(world_size)
        ]
        deadline = time.monotonic() + timeout_s
        try:
            codes = [process.wait(max(1.0, deadline - time.monotonic())) for process in processes]
        except subprocess.TimeoutExpired:
            codes = []
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        if codes != [0] * world_size:
            failed = [rank for rank, code in enumerate(codes) if code != 0] or [0]  # timed out: rank 0's
            errors = "".join(f"rank {r}:\n{Path(work, f'err-{r}.log').read_text()[-3000:]}" for r in failed[:2])
            raise RuntimeError(f"{config} at W={world_size}: exit codes {codes or 'timed out'}; {errors}")
        ranks = [json.loads(Path(work, f"rank-{rank}.json").read_text()) for rank in range(world_size)]
        return {"launched": started, "ranks": ranks}


def _wait_for_memory(world_size: int) -> float:
    """Wait until this many ranks fit in the memory available (the machine is shared); the seconds waited."""
    started = time.monotonic()
    while psutil.virtual_memory().available < world_size * _MEMORY_PER_RANK:
        time.sleep(10)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fits", description=__doc__)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--values", type=int, nargs="+", default=[1, 5, 20], help="synced values per step")
    parser.add_argument("--repeats", type=int, nargs="+", default=[8], help="per world size (the last repeats)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per fit (after --skip)")
    parser.add_argument("--skip", type=int, default=5, help="steps dropped at the start of each fit")
    parser.add_argument("--smoke", action="store_true", help="one small launch of each configuration (CI)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--machine", default=None, help="the results' file name part (default: this machine's)")
    args = parser.parse_args(argv)
    sizes = [2] if args.smoke else args.world_sizes
    plan = {
        "values": [1] if args.smoke else args.values,
        "steps": 3 if args.smoke else args.steps,
        "skip": 2 if args.smoke else args.skip,
    }
    repeats = {
        size: 1 if args.smoke else args.repeats[min(index, len(args.repeats) - 1)] for index, size in enumerate(sizes)
    }
    order = random.Random(args.seed)
    started = time.time()
    sessions: dict[int, dict[str, list[dict[str, Any]]]] = {}
    loads: dict[int, list[Any]] = {}
    waited: dict[int, float] = {}
    page = ""
    for size in sizes:
        sessions[size] = {config: [] for config in CONFIGS}
        loads[size] = [load_average()]
        waited[size] = 0.0
        for repeat in range(repeats[size]):
            for config in order.sample(CONFIGS, len(CONFIGS)):
                waited[size] += _wait_for_memory(size)
                print(f"W={size} repeat {repeat + 1}/{repeats[size]}: {config} (load {load_average()})", flush=True)
                sessions[size][config].append(launch(config, size, plan, 600 + 30 * size))
        loads[size].append(load_average())
        # written after each world size: a run cut short (the grid may outlast a session) keeps the sizes it finished
        page = _write(args, sessions, plan, repeats, started, loads, waited)
    print(page)
    return 0


def _write(
    args: argparse.Namespace,
    sessions: dict[int, dict[str, list[dict[str, Any]]]],
    plan: dict[str, Any],
    repeats: dict[int, int],
    started: float,
    loads: dict[int, list[Any]],
    waited: dict[int, float],
) -> str:
    """Write the results of the world sizes finished so far (``fits-<machine>.json`` and ``.md``); the page."""
    results = summarize(sessions)
    sizes = list(sessions)
    results["metadata"] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started),
        "machine": args.machine or cpu_machine(),
        "cpus": os.cpu_count(),
        "load_average": {str(size): load for size, load in loads.items()},
        "waited_for_memory_s": {str(size): round(seconds) for size, seconds in waited.items()},
        "counts": plan | {"repeats": {str(size): repeats[size] for size in sizes}, "world_sizes": sizes},
        "smoke": args.smoke,
        "torch": torch.__version__,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"fits-{results['metadata']['machine']}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    page = markdown(results)
    stem.with_suffix(".md").write_text(page, encoding="utf-8")
    print(f"wrote {stem}.json and .md (world sizes {sizes})", flush=True)
    return page


if __name__ == "__main__":
    sys.exit(main())
