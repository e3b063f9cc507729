"""One rank of the channel microbenchmark: each subject timed call by call, the ranks lined up before each call.

Subjects (every one a collective over every rank, on gloo, CPU tensors):

* ``check``: one lightning-ext hang check (``Lockstep.agree`` on a fixed point), on its own channel;
* ``barrier``: ``torch.distributed.barrier()`` on the world group (gloo's dissemination barrier);
* ``all_reduce``: ``torch.distributed.all_reduce`` of one float32 element on the world group (gloo's ring);
* ``broadcast``: ``torch.distributed.broadcast`` of one int64 element from rank 0 (gloo's binomial tree).

Each round runs every subject ``calls`` times, in a seeded order the same on every rank, an untimed barrier on a group
of its own before each call. With ``busy``, a thread in every rank competes for the GIL throughout: a pure-Python
loop, as a busy DataLoader's or logger's thread is. Each call's wall time and the calling thread's CPU time are kept;
the channel's set-up time is measured once per session.
"""

import json
import os
import random
import resource
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["SUBJECTS", "rank_main"]

SUBJECTS = ("check", "barrier", "all_reduce", "broadcast")
TIMEOUT = timedelta(seconds=300)


def _busy(stop: threading.Event) -> None:
    """Hold the GIL as a busy Python thread does: pure-Python work, released only when the interpreter switches."""
    data = list(range(2000))
    while not stop.is_set():
        sum(x * x for x in data)


def _memory_mib() -> dict[str, float]:
    """This process's anonymous (private) memory and its peak resident size, in MiB."""
    anonymous = 0
    with open("/proc/self/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            if line.startswith("Anonymous:"):
                anonymous = int(line.split()[1])
    return {"anonymous": anonymous / 1024, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _check_subject(rank: int, world_size: int) -> tuple[Callable[[], None], float, Callable[[], None]]:
    """lightning-ext's check on its own channel: the call, the channel's set-up seconds, and the teardown."""
    from lightning_ext._checks.lockstep import Lockstep
    from lightning_ext._checks.points import Point
    from lightning_ext._collective import CheckChannel

    try:
        from lightning_ext._collective import default_store
        from lightning_ext._network import Place
    except ImportError:  # a checkout from before issue 39
        pass
    from lightning_ext._watch.facts import Recorder
    from lightning_ext._watch.watchdog import Watchdog

    watchdog = Watchdog("channel-bench/", Recorder(rank, world_size, None))
    started = time.perf_counter()
    if hasattr(CheckChannel, "connect"):
        channel = CheckChannel(rank, world_size)
        channel.connect(default_store("channel-bench/"), Place("127.0.0.1"), 60.0)
    else:  # a checkout from before issue 39 (the pairs connected by the constructor), measured alike
        channel = CheckChannel(watchdog.store, rank, world_size)  # type: ignore[call-arg, arg-type]
    set_up = time.perf_counter() - started
    lockstep = Lockstep(channel, watchdog, lambda: None)
    point = Point("collective", ("bench",), "the benchmark's check")

    def check() -> None:
        if not lockstep.agree(point):
            raise RuntimeError("the ranks disagreed on a fixed point")

    def close() -> None:
        watchdog.stop()
        lockstep.close()

    return check, set_up, close


def measure(rank: int, world_size: int, rounds: int, calls: int, warmup: int, seed: int) -> dict[str, Any]:
    """Time every subject, without and with a GIL-competing thread; returns this rank's samples (ns) by subject."""
    check, set_up, close = _check_subject(rank, world_size)
    line_up = dist.new_group(backend="gloo", timeout=TIMEOUT)  # its own group: never pairs with a subject's call
    one = torch.zeros(1)
    root = torch.zeros(1, dtype=torch.int64)
    subjects: dict[str, Callable[[], None]] = {
        "check": check,
        "barrier": lambda: dist.barrier(),
        "all_reduce": lambda: dist.all_reduce(one),
        "broadcast": lambda: dist.broadcast(root, src=0),
    }
    found: dict[str, Any] = {"set_up_s": set_up, "samples": {}, "cpu": {}, "rounds": rounds}
    for busy in (False, True):
        stop = threading.Event()
        thread = threading.Thread(target=_busy, args=(stop,), daemon=True) if busy else None
        if thread is not None:
            thread.start()
        samples: dict[str, list[list[int]]] = {name: [] for name in subjects}
        cpu: dict[str, list[list[int]]] = {name: [] for name in subjects}
        order = random.Random(seed)
        for number in range(warmup + rounds):
            kept = number >= warmup
            for name in order.sample(list(subjects), len(subjects)):
                call, times, spent = subjects[name], [], []
                for _ in range(calls):
                    dist.barrier(group=line_up)
                    started, on_cpu = time.perf_counter_ns(), time.thread_time_ns()
                    call()
                    times.append(time.perf_counter_ns() - started)
                    spent.append(time.thread_time_ns() - on_cpu)
                if kept:
                    samples[name].append(times)
                    cpu[name].append(spent)
        stop.set()
        if thread is not None:
            thread.join()
        found["samples"]["busy" if busy else "idle"] = samples
        found["cpu"]["busy" if busy else "idle"] = cpu
    found["memory"] = _memory_mib()
    close()
    return found


def rank_main(rank: int, world_size: int, port: int, counts: dict[str, int], work: str) -> None:
    """One spawned rank: join the group on localhost ``port``, :func:`measure`, every rank writes its samples."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size), RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=TIMEOUT)
    try:
        found = measure(rank, world_size, counts["rounds"], counts["calls"], counts["warmup"], counts["seed"])
        Path(work, f"rank-{rank}.json").write_text(json.dumps(found))
        dist.barrier()
    finally:
        dist.destroy_process_group()
