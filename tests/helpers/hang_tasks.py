"""Real ``Trainer.fit`` runs whose ranks part ways on purpose, run inside the rank pools (tests/helpers/pool.py).

A *script* says how many batches each rank's train and val loaders yield (``None``: a stream without length) and
what each hook logs with ``sync_dist=True``; an entry may be skipped by some ranks. The parent builds the expected
outcome from the script alone (tests/checks/test_checks.py) and compares it with what every rank reports.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from lightning_ext import PerRankMetrics, PolicyDDPStrategy

HOOKS = ("training_step", "validation_step", "on_train_epoch_end", "on_validation_epoch_end")
SPECIAL = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class Stream(IterableDataset):
    """``length`` one-feature samples, without ``__len__``."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):  # type: ignore[no-untyped-def]
        return ((torch.tensor([float(index)]),) for index in range(self.length))


def value(entry: dict[str, Any], rank: int, epoch: int, batch: int) -> float:
    """The value ``entry`` logs on ``rank`` at (epoch, batch); the parent computes the same numbers."""
    special = entry.get("special")
    if special is not None and rank == special[0]:
        return SPECIAL[special[1]]
    return float(rank + 1) * 0.5 + epoch + 0.25 * batch + entry["offset"]


class ScriptModule(L.LightningModule):
    def __init__(self, script: dict[str, Any]) -> None:
        super().__init__()
        self.script = script
        self.layer = torch.nn.Linear(1, 1)

    def _log(self, hook: str, batch: int = 0) -> None:
        rank = self.global_rank
        for entry in self.script["logs"]:
            if entry["hook"] != hook or rank in entry["skipped_by"]:
                continue
            phase_step = entry["phase"] == "step" and hook.endswith("_step")
            number: Any = value(entry, rank, self.current_epoch, batch)
            if rank in entry.get("float64_on", ()):  # a tensor of another dtype than the float32 others log
                number = torch.tensor(number, dtype=torch.float64)
            self.log(entry["name"], number, sync_dist=True, on_step=phase_step, on_epoch=not phase_step)  # log: here

    def _loader(self, stage: str) -> DataLoader:
        length = self.script[f"{stage}_batches"][self.global_rank]
        if isinstance(length, list):  # a stream: [number of batches]
            return DataLoader(Stream(length[0]), batch_size=1)
        return DataLoader(TensorDataset(torch.arange(float(length)).unsqueeze(1)), batch_size=1)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._log("training_step", batch_idx)
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._log("validation_step", batch_idx)

    def on_train_epoch_end(self) -> None:
        self._log("on_train_epoch_end")

    def on_validation_epoch_end(self) -> None:
        self._log("on_validation_epoch_end")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)  # the values logged must not depend on training


def fit(log_dir: str, script: dict[str, Any], options: dict[str, Any], world_size: int) -> dict[str, Any]:
    """One fit on this pool's ranks; returns this rank's outcome (its error, its counters, its callback metrics)."""
    if options.get("stock"):
        strategy: Any = DDPStrategy(start_method="popen") if world_size > 1 else "auto"
    else:
        strategy = PolicyDDPStrategy(per_rank_metrics=PerRankMetrics(flush_every_n_rows=1000), **options)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy=strategy,
        max_epochs=script.get("epochs", 2),
        logger=CSVLogger(log_dir, name="", version="run"),
        log_every_n_steps=1,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    outcome: dict[str, Any] = {"error": None, "message": None}
    try:
        trainer.fit(ScriptModule(script))
    except Exception as error:
        outcome = {"error": type(error).__name__, "message": str(error)}
    outcome.update(
        global_step=trainer.global_step,
        epochs=trainer.current_epoch,
        callback_metrics={key: float(value) for key, value in trainer.callback_metrics.items()},
    )
    return outcome


_LOCKSTEPS: dict[str, Any] = {}


def lockstep_verdicts(namespace: str, identities: list[Any]) -> list[Any]:
    """Pass one check per identity on this rank's side of a real Lockstep (one per ``namespace``, kept for the next
    call); return each verdict, or, where the ranks disagreed, the identities gathered from every rank."""
    import torch.distributed as dist

    from lightning_ext._checks.lockstep import Lockstep
    from lightning_ext._checks.points import Point
    from lightning_ext._collective import CheckChannel, default_store
    from lightning_ext._network import Place
    from lightning_ext._watch.facts import Recorder
    from lightning_ext._watch.watchdog import Watchdog

    lockstep = _LOCKSTEPS.get(namespace)
    if lockstep is None:
        rank, world = dist.get_rank(), dist.get_world_size()
        watchdog = Watchdog(namespace, Recorder(rank, world, None))
        channel = CheckChannel(rank, world)
        channel.connect(default_store(namespace), Place("127.0.0.1"), 60.0)
        lockstep = _LOCKSTEPS[namespace] = Lockstep(channel, watchdog, lambda: None)
    results: list[Any] = []
    for identity in identities:
        point = Point("collective", tuple(identity), f"identity {identity}")
        results.append(True if lockstep.agree(point) else [p.identity for p in lockstep.gather(point)])
    return results


def check_filled_before_posted_is_read(namespace: str, busy: float) -> dict[str, Any]:
    """Ranks 1 and 2 wait in a check that rank 0 never starts; rank 0 posts an error, and its watchdog completes their
    check (the fillers), while rank 2's watchdog is busy for ``busy`` seconds (a handler that sleeps), so it has not
    read the error when its check completes. Each rank returns the error it raised and after how many seconds."""
    import time

    import torch.distributed as dist

    from lightning_ext import errors
    from lightning_ext._checks.lockstep import Lockstep
    from lightning_ext._checks.points import Point
    from lightning_ext._collective import CheckChannel, default_store
    from lightning_ext._network import Place
    from lightning_ext._watch.facts import Recorder
    from lightning_ext._watch.watchdog import ErrorRecord, Watchdog

    rank, world = dist.get_rank(), dist.get_world_size()
    watchdog = Watchdog(namespace, Recorder(rank, world, None))
    watchdog.handlers["busy"] = lambda message: time.sleep(busy)
    channel = CheckChannel(rank, world)
    channel.connect(default_store(namespace), Place("127.0.0.1"), 60.0)
    lockstep = Lockstep(channel, watchdog, lambda: None)
    dist.barrier()
    started = time.monotonic()
    try:
        if rank == 2:
            watchdog.notify(rank, "busy")
        if rank == 0:  # once the others say they wait (after the check's first 2 s), post the error
            watchdog.store.wait([f"pending/{other}" for other in range(1, world)])  # type: ignore[attr-defined]
            message = "rank 0 stands for a rank stuck elsewhere"
            watchdog.post(ErrorRecord("DivergentCollectiveError", message, rank))
            raise errors.DivergentCollectiveError(message)
        lockstep.require(Point("collective", ("barrier",), "strategy.barrier()"))
        outcome: dict[str, Any] = {"error": None}
    except Exception as error:
        outcome = {"error": type(error).__name__, "message": str(error)}
    outcome["seconds"] = time.monotonic() - started
    watchdog.stop()
    lockstep.close()
    return outcome


def lockstep_close(namespace: str) -> None:
    """Stop the watchdog and close the links of ``namespace``'s Lockstep."""
    lockstep = _LOCKSTEPS.pop(namespace)
    lockstep.watchdog.stop()
    lockstep.channel.close()


def fit_with_loggers(log_dir: str, loggers: int, checkpoint_policy: Any, world_size: int) -> dict[str, Any]:
    """A fit whose ranks may configure different loggers or policies: every rank reports its error."""
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy=PolicyDDPStrategy(checkpoint_policy=checkpoint_policy),
        max_epochs=1,
        logger=[CSVLogger(log_dir, name=f"logger{index}") for index in range(loggers)] or False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    script = {"train_batches": [2] * world_size, "val_batches": [1] * world_size, "logs": []}
    try:
        trainer.fit(ScriptModule(script))
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error)}
    return {"error": None, "message": None}


def ledger(namespace: str) -> dict[str, Any]:
    """Count this rank's collective calls through a real Recorder; rank 0 asks rank 1's watchdog for its facts while
    rank 1 is blocked in an all-reduce that rank 0 makes only afterwards."""
    import threading
    import time

    import torch
    import torch.distributed as dist

    from lightning_ext._watch.facts import Recorder
    from lightning_ext._watch.watchdog import Watchdog

    rank = dist.get_rank()
    recorder = Recorder(rank, dist.get_world_size(), None)
    recorder.install()
    watchdog = Watchdog(namespace, recorder)
    try:
        tensor = torch.ones(1)
        dist.all_reduce(tensor)  # counted
        dist.barrier()  # counted
        if rank == 0:  # point-to-point calls are not counted (they are not symmetric)
            dist.send(tensor, 1)
        else:
            dist.recv(tensor, 0)
        thread = threading.Thread(target=dist.all_reduce, args=(torch.ones(1),))
        thread.start()  # another thread's call is not counted
        thread.join()
        counted = dict(recorder.counts)
        seen = None
        if rank == 0:
            time.sleep(0.5)  # rank 1 is inside its all-reduce by now
            facts = watchdog.facts_of([1])[1]
            seen = {"inside": facts.inside.name if facts.inside else None, "index": facts.inside and facts.inside.index}
        dist.all_reduce(tensor)  # rank 1 waits here for rank 0
        return {"counted": counted, "after": dict(recorder.counts), "seen": seen, "total": recorder.total()}
    finally:
        recorder.uninstall()
        watchdog.stop()


def count_each_collective() -> dict[str, int]:
    """Call each ``torch.distributed`` function once, as a user would, through a real Recorder: how many calls it
    counted for each (the table is written here, by hand, from torch's documentation of each call)."""
    from datetime import timedelta

    import torch.distributed as dist

    from lightning_ext._watch.facts import Recorder

    rank, world = dist.get_rank(), dist.get_world_size()

    def ones(size: int = 1) -> torch.Tensor:
        return torch.ones(size)

    def parts() -> list[torch.Tensor]:
        return [torch.zeros(1) for _ in range(world)]

    calls: dict[str, Callable[[], object]] = {
        "_all_gather_base": lambda: dist._all_gather_base(torch.zeros(world), ones()),
        "_reduce_scatter_base": lambda: dist._reduce_scatter_base(torch.zeros(1), ones(world)),
        "all_gather": lambda: dist.all_gather(parts(), ones()),
        "all_gather_coalesced": lambda: dist.all_gather_coalesced([[torch.zeros(1)] for _ in range(world)], [ones()]),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.zeros(world), ones()),
        "all_gather_object": lambda: dist.all_gather_object([None] * world, rank),
        "all_gather_single": lambda: dist.all_gather_single(torch.zeros(world), ones()),
        "all_reduce": lambda: dist.all_reduce(ones()),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([ones(), ones(2)]),
        "all_to_all": lambda: dist.all_to_all(parts(), [ones() for _ in range(world)]),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.zeros(world), ones(world)),
        "barrier": lambda: dist.barrier(),
        "broadcast": lambda: dist.broadcast(ones(), 0),
        "broadcast_object_list": lambda: dist.broadcast_object_list([rank], 0),
        "gather": lambda: dist.gather(ones(), parts() if rank == 0 else None, 0),
        "gather_object": lambda: dist.gather_object(rank, [None] * world if rank == 0 else None, 0),
        "monitored_barrier": lambda: dist.monitored_barrier(timeout=timedelta(seconds=60)),
        "reduce": lambda: dist.reduce(ones(), 0),
        "reduce_scatter": lambda: dist.reduce_scatter(torch.zeros(1), [ones() for _ in range(world)]),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(torch.zeros(1), ones(world)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.zeros(1), ones(world)),
        "scatter": lambda: dist.scatter(torch.zeros(1), [ones() for _ in range(world)] if rank == 0 else None, 0),
        "scatter_object_list": lambda: dist.scatter_object_list([None], list(range(world)) if rank == 0 else None, 0),
        # one rank sends, the next receives (a ring): not symmetric
        "send/recv": lambda: (
            (dist.send(ones(), (rank + 1) % world), dist.recv(ones(), (rank - 1) % world))
            if rank % 2 == 0
            else (dist.recv(ones(), (rank - 1) % world), dist.send(ones(), (rank + 1) % world))
        ),
        "isend/irecv": lambda: [
            request.wait()
            for request in (dist.isend(ones(), (rank + 1) % world), dist.irecv(ones(), (rank - 1) % world))
        ],
    }
    recorder = Recorder(rank, world, None)
    recorder.install()
    counted = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's deprecated names are called on purpose
            for name, call in calls.items():
                before = recorder.total()
                call()
                counted[name] = recorder.total() - before
    finally:
        recorder.uninstall()
    return counted


def store_connections_across_fits(log_dir: str, world_size: int) -> list[list[int]]:
    """Two fits with the checks and the stall report on, one after the other in this process: after each, the local
    ports of this process's TCP connections to the default group's store server (read from the OS with psutil)."""
    import psutil
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    script = {"train_batches": [2] * world_size, "val_batches": [1] * world_size, "logs": []}
    ports = []
    for run in range(2):
        outcome = fit(f"{log_dir}/{run}", script, {"stall_timeout": 60}, world_size)
        if outcome["error"] is not None:
            raise RuntimeError(outcome["message"])
        connections = psutil.Process().net_connections(kind="tcp")
        ports.append(sorted(c.laddr.port for c in connections if c.raddr and c.raddr.port == store.port))
    return ports


def slow_exchange(namespace: str, timeout: float, delay: float) -> tuple[bool, float]:
    """Connect a channel within ``timeout`` s (the ranks lined up first), then pass one check, the last rank ``delay``
    s late: whether every rank agreed, and how long this rank waited."""
    import torch.distributed as dist

    from lightning_ext._collective import CheckChannel, default_store
    from lightning_ext._network import Place

    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    channel = CheckChannel(rank, world)
    channel.connect(default_store(namespace), Place("127.0.0.1"), timeout)
    if rank == world - 1:
        time.sleep(delay)
    started = time.monotonic()
    exchange = channel.start(7)
    while not exchange.wait(0.5):
        pass
    waited = time.monotonic() - started
    channel.close()
    return exchange.agreed, waited
