"""Whether a DDP forward pass that some ranks make while one rank holds back blocks, and what the facts said of it.

Run in the rank pools (tests/helpers/pool.py): every rank builds the same ``DistributedDataParallel`` model and runs
the same steps; then every rank but one (the late one) makes one more forward pass, while the late one holds back.
What blocks is what DDP does on the real gloo group; what was recorded is what :mod:`lightning_ext._watch.ddp_forward`
foresaw, read from each early rank's :class:`Recorder` by another thread while its pass runs (as a watchdog reads it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lightning_ext._watch import ddp_forward
from lightning_ext._watch.facts import Recorder
from lightning_ext._watch.rank_facts import Facts

STEPS = ("step", "accumulate", "eval")
PROBES = ("grad", "no_grad", "no_sync")
HOLD = 0.5  # seconds the late rank holds back once every early rank has returned or is in a recorded pass
NEVER = 60.0  # seconds the late rank waits for unrecorded passes to return: only a pass that blocks takes that long


def _model(example: dict[str, Any]) -> DistributedDataParallel:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(4, 4)]
    if example["buffers"]:
        layers.append(torch.nn.BatchNorm1d(4))
    layers += [torch.nn.Tanh(), torch.nn.Linear(4, 1)]
    options = {key: example[key] for key in ("find_unused_parameters", "static_graph", "broadcast_buffers")}
    return DistributedDataParallel(torch.nn.Sequential(*layers), **options)


def _step(ddp: DistributedDataParallel, recorder: Recorder, kind: str, x: torch.Tensor) -> None:
    """``"step"``: forward and backward with gradient sync; ``"accumulate"``: both within ``no_sync``; ``"eval"``: a
    forward pass without grad mode (validation's)."""
    if kind == "eval":
        with torch.no_grad():
            ddp(x)
        return
    sync = kind == "step"
    with contextlib.nullcontext() if sync else ddp.no_sync():
        loss = ddp(x).pow(2).mean()
        with recorder.backward_pass(sync):  # as the hang checks' watch of the precision plugin's backward does
            loss.backward()


def _probe(ddp: DistributedDataParallel, probe: str) -> Any:
    return {"grad": contextlib.nullcontext(), "no_grad": torch.no_grad(), "no_sync": ddp.no_sync()}[probe]


def forward_alone(example: dict[str, Any]) -> dict[str, Any]:
    """Build the example's model, run its ``steps`` on every rank, then its ``probe`` (``"grad"``, ``"no_grad"``,
    ``"no_sync"``) on every rank but ``example["late"]``, which holds back (``example["hold"]`` or :data:`HOLD`, and
    :data:`NEVER`) and then comes.

    Returns, on an early rank: ``recorded`` (its pass was recorded), ``seen`` (its facts while in it, or ``None``),
    ``blocked`` (its pass returned only after the late rank came); on the late rank: ``facts``, its own, as it held
    back (what a waiting rank would report)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    key = f"ddp_forward/{example['id']}"
    recorder = Recorder(rank, world, None)
    ddp = _model(example)
    ddp_forward.watch(ddp, recorder)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(rank))
    for kind in example["steps"]:
        _step(ddp, recorder, kind, x)
    if rank == example["late"]:
        facts = recorder.snapshot()
        _hold_back(store, key, [other for other in range(world) if other != rank], example.get("hold", HOLD))
        with _probe(ddp, example["probe"]):
            ddp(x)
        return {"facts": facts}
    seen: list[Facts] = []
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(recorder, store, key, seen, done))
    watcher.start()
    before = recorder.forwards
    try:
        with _probe(ddp, example["probe"]):
            ddp(x)
    finally:
        done.set()
        store.set(f"{key}/done/{rank}", "1")
    blocked = store.check([f"{key}/coming"])
    watcher.join()
    return {"recorded": recorder.forwards - before, "seen": seen[0] if seen else None, "blocked": blocked}


def _watch(recorder: Recorder, store: Any, key: str, seen: list[Facts], done: threading.Event) -> None:
    """An early rank's other thread: once its training thread is in a recorded pass, tell the late rank."""
    while not done.wait(0.005):
        facts = recorder.snapshot()
        if facts.forward is not None:
            seen.append(facts)
            store.set(f"{key}/recorded/{recorder.rank}", "1")
            return


def _hold_back(store: Any, key: str, early: list[int], hold: float) -> None:
    """Wait until every early rank's pass returned or, once each has returned or is in a recorded pass, ``hold`` s
    more (:data:`NEVER` s at most); then come."""
    deadline = time.monotonic() + NEVER
    entered_at: float | None = None
    while time.monotonic() < deadline:
        done = [store.check([f"{key}/done/{rank}"]) for rank in early]
        if all(done):
            return
        if entered_at is None and all(d or store.check([f"{key}/recorded/{r}"]) for r, d in zip(early, done)):
            entered_at = time.monotonic()
        if entered_at is not None and time.monotonic() - entered_at > hold:
            break
        time.sleep(0.005)
    store.set(f"{key}/coming", "1")
