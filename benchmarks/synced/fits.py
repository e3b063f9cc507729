"""One rank of the synced-logging benchmark: a fit per configuration and number of synced values, counted, then timed.

Each fit is the comm benchmark's small model (``benchmarks.comm.training``) logging ``values`` synced values and one
un-synced value per step in ``training_step``, with a ``CSVLogger`` and ``log_every_n_steps=1``. Configurations:

* ``stock``, ``stock_twin``: ``DDPStrategy`` with lightning-ext's runtime seams taken out (the twin: stock's noise);
* ``defaults``: ``PolicyDDPStrategy()`` (coalesced sync, hang checks on);
* ``per_value``: ``PolicyDDPStrategy(log_sync="per_value")``: stock's sync per value, checked;
* ``unchecked``: ``PolicyDDPStrategy(hang_checks=False)``: coalesced, no checks.

First one untimed fit per (configuration, values) counts the ``torch.distributed`` calls per step (and lightning-ext's
checks, as ``check``); then ``repeats`` rounds time every (configuration, values) fit once, in a new seeded order each
round, the same on every rank. A step is timed from one ``on_train_batch_start`` to the next on rank 0. The counted
fit also counts the host-device synchronizations per step (``host_sync``: ``item()`` and the like).

On ``device="cuda"`` every rank trains on ``cuda:0`` (one GPU): NCCL at world size 1, gloo (which all-reduces CUDA
tensors through host memory) at 2 and more, two NCCL ranks being unable to share a device. Each rank is then a
one-device node to Lightning (``num_nodes`` ranks, ``NODE_RANK`` its rank).
"""

import gc
import json
import logging
import os
import random
import warnings
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy

from benchmarks.comm.stock import stock_lightning
from benchmarks.comm.training import SKIP_STEPS, _loader, _SmallModel, _StepClock
from benchmarks.helpers.collectives import count_collectives
from benchmarks.helpers.host_syncs import count_host_syncs
from lightning_ext import PolicyDDPStrategy

__all__ = ["CONFIGS", "backend", "measure", "rank_main"]

CONFIGS: dict[str, dict[str, Any] | None] = {  # the strategy's options; None: stock DDPStrategy
    "stock": None,
    "stock_twin": None,
    "defaults": {},
    "per_value": {"log_sync": "per_value"},
    "unchecked": {"hang_checks": False},
}


def backend(device: str, world_size: int) -> str:
    """The process group's backend: NCCL for one rank on the GPU, else gloo (ranks sharing one GPU, or CPU ranks)."""
    return "nccl" if device == "cuda" and world_size == 1 else "gloo"


def _layout(device: str, world_size: int) -> dict[str, Any]:
    """The ``Trainer``'s device arguments: a device per rank on CPU; on CUDA, ``cuda:0`` for every rank."""
    if device == "cuda":
        return {"accelerator": "gpu", "devices": [0], "num_nodes": world_size}
    return {"accelerator": "cpu", "devices": world_size}


def _fit(config: str, values: int, root: str, world_size: int, batches: int, clock: _StepClock, device: str) -> None:
    options = CONFIGS[config]
    strategy = DDPStrategy() if options is None else PolicyDDPStrategy(**options)
    os.environ["WORLD_SIZE"] = str(world_size)  # LightningEnvironment.teardown removes it after every fit
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        **_layout(device, world_size),
        strategy=strategy,
        max_epochs=1,
        max_steps=batches,
        logger=CSVLogger(root),
        log_every_n_steps=1,
        callbacks=[clock],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=root,
    )
    context: AbstractContextManager[object] = stock_lightning() if options is None else nullcontext()
    with context:
        trainer.fit(_SmallModel(synced=values), _loader(world_size, batches, 0))


def measure(
    world_size: int, values: list[int], steps: int, repeats: int, workdir: str, device: str = "cpu"
) -> dict[str, Any]:
    """Count, then time, every (configuration, values) fit; run on every rank of the process group.

    Returns:
        ``{"collectives": {"<config>/<values>": {op: calls per step}}, "step_ns": {"<config>/<values>": [[step
        times of one fit], ...]}}``: rank 0's figures (the calls include ``host_sync``, the synchronizations).

    """
    batches = SKIP_STEPS + steps + 1
    subjects = [(config, count) for count in values for config in CONFIGS]
    found: dict[str, Any] = {"collectives": {}, "step_ns": {f"{c}/{n}": [] for c, n in subjects}}
    for config, count in subjects:
        with count_collectives() as counts, count_host_syncs(counts):
            clock = _StepClock(counts)
            _fit(config, count, os.path.join(workdir, f"count-{config}-{count}"), world_size, batches, clock, device)
        per_window = [after - before for before, after in zip(clock.snapshots, clock.snapshots[1:], strict=False)]
        kept = per_window[SKIP_STEPS:]
        total: Counter[str] = sum(kept, Counter())
        found["collectives"][f"{config}/{count}"] = {op: n / len(kept) for op, n in sorted(total.items())}
    order = random.Random(0)  # the same on every rank
    for repeat in range(repeats):
        for config, count in order.sample(subjects, len(subjects)):
            gc.collect()
            clock = _StepClock(None)
            root = os.path.join(workdir, f"time-{config}-{count}-{repeat}")
            _fit(config, count, root, world_size, batches, clock, device)
            found["step_ns"][f"{config}/{count}"].append(clock.windows_ns())
    return found


def rank_main(
    rank: int, world_size: int, port: int, values: list[int], steps: int, repeats: int, work: str, device: str
) -> None:
    """One spawned rank: join the process group on localhost ``port``, :func:`measure`, rank 0 writes
    ``found.json``."""
    shared = device == "cuda"  # every rank on cuda:0, a one-device node to Lightning
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size), RANK=str(rank),
        LOCAL_RANK="0" if shared else str(rank), NODE_RANK=str(rank) if shared else "0",
    )  # fmt: skip
    warnings.simplefilter("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_ext"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    if shared:
        torch.cuda.set_device(0)
    timeout = timedelta(seconds=120)
    dist.init_process_group(backend(device, world_size), rank=rank, world_size=world_size, timeout=timeout)
    try:
        found = measure(world_size, values, steps, repeats, work, device)
        if rank == 0:
            Path(work, "found.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()
