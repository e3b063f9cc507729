"""Training-step time and collectives per logging step: stock ``DDPStrategy`` against lightning-ext's features.

Every configuration runs a real ``Trainer.fit`` on the ranks of the session's process group (Lightning reuses it:
the ranks carry ``LOCAL_RANK``/``WORLD_SIZE``/...), with the same small model, data and seed, ``CSVLogger`` and
``log_every_n_steps=1``:

* ``stock``: ``DDPStrategy()``, run inside :func:`~benchmarks.comm.stock.stock_lightning` (no lightning-ext seam);
* ``per_rank_metrics``: ``PolicyDDPStrategy(per_rank_metrics=True, hang_checks=False, stall_timeout=None)``: the
  per-rank cost alone;
* ``telemetry``: the same with ``PerRankMetrics(telemetry=True, telemetry_every_n_steps=1)``: a telemetry row at
  every step, compared with ``per_rank_metrics`` (the same run without telemetry);
* ``stock_tensorboard`` and ``tensorboard``: ``stock`` and ``per_rank_metrics`` with a ``TensorBoardLogger`` in place
  of the ``CSVLogger``, so that every rank also writes its rows to its own TensorBoard event file; the second is
  compared with the first; likewise ``stock_mlflow`` and ``mlflow`` (an ``MLFlowLogger`` on a local file store: every
  rank's child run), ``stock_wandb`` and ``wandb`` (a ``WandbLogger`` offline: every rank's own run);
* ``hang_checks``: ``PolicyDDPStrategy()``, the default hang checks (each synced ``self.log`` checked in place of
  Lightning's barrier, the batch counts and epoch-end syncs checked once per epoch);
* ``hang_checks_debug``: ``PolicyDDPStrategy(hang_checks="debug")`` (measured, no target);
* ``stall_off`` and ``stall_report``: ``PolicyDDPStrategy(hang_checks=False)`` with ``stall_timeout=None`` and with
  the default stall report (its counted collective calls and backward passes, its monitor thread); the second is
  compared with the first: the stall report's own cost per step;
* ``stock_twin``: a second, identical ``stock`` fit, compared with the first: the measurement's own noise, so that a
  ratio can be read against the ratio of stock to itself in the same run;
* ``stock_stream`` and ``unsized_checks``: the same data as a stream without ``len`` (an ``IterableDataset`` that
  yields each rank's shard), under stock ``DDPStrategy`` and under ``PolicyDDPStrategy(check_unsized_loaders=True)``
  (one check per batch); the second is compared with the first (measured, no target).

A step is timed from one ``on_train_batch_start`` to the next, so each window holds the whole step: the forward and
backward passes with DDP's gradient all-reduce, the optimizer step, the batch-end hooks and then the logger connector's
``log_metrics`` (where the per-rank row is written), the loggers' periodic save, and the fetch of the next batch. The
first :data:`SKIP_STEPS` windows (lazy set-up, DDP's bucket rebuild, the first CSV header) are dropped.

Each window is also timed in CPU time of the main thread (``time.thread_time_ns``): the per-rank work is CPU work on
that thread, and CPU time barely moves with the scheduling noise that the step's collectives pick up on a busy
machine, so it shows the cost itself (reported beside the wall-time target, as a diagnostic).

**The cost of one per-rank row.** Within each timed per-rank fit, at its last batch (outside every timed window),
after the step's own ``self.log`` calls, the per-rank row path runs :data:`ROW_LOOPS_PER_STEP` ``x train_steps``
times on the fit's real objects: for each row, ``record_update`` for both logged values (what the
``_ResultMetric.forward`` seam adds to each ``self.log``), ``loggers_for`` (the logger connector's seam: pairs the
row's keys with their local values), then the per-rank logger's ``log_metrics`` and ``save`` with the row Lightning
builds for its loggers, the logging step advancing by one per row, so the writer flushes every 100 rows to the real
file as in training. Lightning's own work (``self.log``, the row, the stock loggers) is not in the loop, so the time
per row is lightning-ext's per-rank cost alone, without the noise of a step (the seams' few attribute lookups aside).

In the ``tensorboard``, ``mlflow`` and ``wandb`` fits the same row loop also hands each row to the logger's sink, and
ends with a flush of the sink (inside the timing), so that what it holds is written (TensorBoard's writer thread: each
record's CRC and append; MLflow: the rows' last batch); those rows are timed in CPU time of the whole process as well
(the writer's thread included), not only the main thread's. W&B's own process, which writes its runs, is not in it.

**The cost of one telemetry sample.** Likewise, within each timed telemetry fit, at its last batch, the telemetry
path of one batch runs :data:`ROW_LOOPS_PER_STEP` ``x train_steps`` times on the fit's own objects: the batch and
its phases timed as the strategy's methods and the loop's hooks time them (the broadcast at the batch's start, the
fetch, ``optimizer_step`` around ``training_step`` with a synced value's collective, and a real backward pass of a
four-element graph with the gradient all-reduce's wait marked: a hook on the loss's node and two autograd final
callbacks), then the row handed to the per-rank writer (flushing every 100 rows) and kept for the live straggler
check, with the rank's memory when a second has passed since it was last read, as in training. The same number of
backward passes of that graph without telemetry is timed too and subtracted. A reading of the memory (process,
DataLoader workers, host) is timed on its own as well.

**The cost of the stall report's watching.** Likewise, within each timed ``stall_report`` fit, at its last batch,
one step's worth of what the stall report adds to the training thread runs :data:`ROW_LOOPS_PER_STEP`
``x train_steps`` times: three counted ``torch.distributed`` calls (the wrapper the stall report installs, with the
fit's own recorder, from the training step's real call stack, around a function that communicates nothing: the
collective itself is stock's) and one synced backward pass noted; the same loop with the bare function is
subtracted. Its monitor thread wakes once per ``stall_timeout / 10`` (at most every 30 s) and is not in the loop.

**Where the ranks line up.** In every timed fit, the time spent in ``torch.distributed.barrier`` (Lightning's, before
each synced value, in the stock fits) and in lightning-ext's checks (``Lockstep.agree``, in the barrier's place) is
summed per step window. Both include waiting for the slowest rank, so their difference per step, paired fit by fit,
is the check's own cost without the noise of the rest of the step.

One untimed fit per configuration first counts every ``torch.distributed`` call with
:func:`benchmarks.helpers.collectives.count_collectives`, window by window, so the count per logging step covers exactly
the timed windows. Then the timed fits run ``repeats`` times; each repeat's fits run back to back, in a new random
order every repeat (seeded), after a garbage collection and an ``os.sync()``, so that no configuration always follows
the per-rank fit whose row loop has just written and freed many rows; the report compares each fit with the stock fit
of its repeat.
"""

import functools
import gc
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from time import perf_counter_ns, process_time_ns, thread_time_ns
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import convert_tensors_to_scalars
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from benchmarks.comm.stock import stock_lightning
from benchmarks.helpers.collectives import count_collectives
from lightning_ext import PerRankMetrics, PolicyDDPStrategy
from lightning_ext._checks.lockstep import Lockstep
from lightning_ext._per_rank.local_values import record_update
from lightning_ext._per_rank.logger import loggers_for
from lightning_ext._telemetry.step_timer import COLLECTIVES, DATA_WAIT, FORWARD, OPTIMIZER, timed_backward
from lightning_ext._watch import facts

__all__ = [
    "BASELINES",
    "CONFIGS",
    "ROW_LOOPS_PER_STEP",
    "SINKS",
    "SKIP_STEPS",
    "SYNCED",
    "TrainingResult",
    "run_training",
]

CONFIGS = (
    "stock",
    "stock_twin",
    "per_rank_metrics",
    "telemetry",
    "hang_checks",
    "hang_checks_debug",
    "stock_stream",
    "unsized_checks",
    "stock_5_synced",
    "stock_5_synced_twin",
    "hang_checks_5_synced",
    "stall_off",
    "stall_report",
    "stock_tensorboard",
    "tensorboard",
    "stock_mlflow",
    "mlflow",
    "stock_wandb",
    "wandb",
)
# what a configuration is compared with, if not "stock"
BASELINES = {
    "tensorboard": "stock_tensorboard",
    "mlflow": "stock_mlflow",
    "wandb": "stock_wandb",
    "unsized_checks": "stock_stream",
    "telemetry": "per_rank_metrics",
    "stock_5_synced_twin": "stock_5_synced",
    "hang_checks_5_synced": "stock_5_synced",
    "stall_report": "stall_off",
}
SYNCED = {"stock_5_synced": 5, "stock_5_synced_twin": 5, "hang_checks_5_synced": 5}  # synced values per step, if not 1
_OPTIONS: dict[str, dict[str, Any]] = {
    "per_rank_metrics": {"per_rank_metrics": True, "hang_checks": False, "stall_timeout": None},
    "tensorboard": {"per_rank_metrics": True, "hang_checks": False, "stall_timeout": None},
    "mlflow": {"per_rank_metrics": True, "hang_checks": False, "stall_timeout": None},
    "wandb": {"per_rank_metrics": True, "hang_checks": False, "stall_timeout": None},
    "telemetry": {
        "per_rank_metrics": PerRankMetrics(telemetry=True, telemetry_every_n_steps=1),
        "hang_checks": False,
        "stall_timeout": None,
    },
    "hang_checks": {},
    "hang_checks_debug": {"hang_checks": "debug"},
    "unsized_checks": {"check_unsized_loaders": True},
    "hang_checks_5_synced": {},
    "stall_off": {"hang_checks": False, "stall_timeout": None},
    "stall_report": {"hang_checks": False},
}
_STREAMS = ("stock_stream", "unsized_checks")
SINKS = ("tensorboard", "mlflow", "wandb")  # the configurations whose rows also go to a logger's sink
# the fits that run a loop at their last batch, and which (see the module docstring)
_LOOPS = {"per_rank_metrics": "rows", **dict.fromkeys(SINKS, "rows"), "telemetry": "telemetry", "stall_report": "watch"}
# the stores of MLflow's file store and W&B's offline runs, in the fit's own directory (no server, no network)
_STORES = {"MLFLOW_ALLOW_FILE_STORE": "true", "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}
SKIP_STEPS = 5
ROW_LOOPS_PER_STEP = 10
_BATCH = 32
_FEATURES = 32


@dataclass
class TrainingResult:
    """What rank 0 measured.

    Attributes:
        step_ns: per configuration, one list of step times (nanoseconds) per timed fit, in repeat order.
        step_cpu_ns: the same windows in CPU time of the main thread.
        collectives_per_step: per configuration, ``torch.distributed`` calls per logging step, by name.
        fit_collectives: per configuration, every call of the whole counted fit (set-up included), by name.
        row_loops: per-rank rows written by the row loop of each timed per-rank fit.
        row_ns: each timed per-rank fit's row-loop time per row (nanoseconds), in repeat order.
        row_cpu_ns: the same in CPU time of the main thread.
        sync_ns: per configuration, each timed fit's time per step in barriers and checks (nanoseconds).
        sample_ns: each timed telemetry fit's time per telemetry sample (nanoseconds), in repeat order.
        sample_cpu_ns: the same in CPU time of the main thread.
        memory_cpu_ns: each timed telemetry fit's CPU time per reading of the rank's memory (at most one a second).
        watch_ns: each timed ``stall_report`` fit's time per step's worth of the stall report's watching.
        watch_cpu_ns: the same in CPU time of the main thread.
        events_row_ns: each timed ``tensorboard`` fit's row-loop time per row, the event file's included.
        events_row_cpu_ns: the same in CPU time of the main thread.
        events_row_process_cpu_ns: the same in CPU time of the whole process (the event writer's thread included).
        sink_row_ns: per sink (``mlflow``, ``wandb``), each timed fit's row-loop time per row, the sink's included.
        sink_row_process_cpu_ns: the same in CPU time of the whole process.

    """

    step_ns: dict[str, list[list[int]]] = field(default_factory=dict)
    step_cpu_ns: dict[str, list[list[int]]] = field(default_factory=dict)
    collectives_per_step: dict[str, dict[str, float]] = field(default_factory=dict)
    fit_collectives: dict[str, dict[str, int]] = field(default_factory=dict)
    row_loops: int = 0
    row_ns: list[float] = field(default_factory=list)
    row_cpu_ns: list[float] = field(default_factory=list)
    sync_ns: dict[str, list[float]] = field(default_factory=dict)
    sample_ns: list[float] = field(default_factory=list)
    sample_cpu_ns: list[float] = field(default_factory=list)
    memory_cpu_ns: list[float] = field(default_factory=list)
    watch_ns: list[float] = field(default_factory=list)
    watch_cpu_ns: list[float] = field(default_factory=list)
    events_row_ns: list[float] = field(default_factory=list)
    events_row_cpu_ns: list[float] = field(default_factory=list)
    events_row_process_cpu_ns: list[float] = field(default_factory=list)
    sink_row_ns: dict[str, list[float]] = field(default_factory=dict)
    sink_row_process_cpu_ns: dict[str, list[float]] = field(default_factory=dict)


class _SmallModel(L.LightningModule):
    """A two-layer regression; logs ``synced`` synced metrics and one un-synced metric every step.

    With ``row_loops``, the batch ``loop_at`` runs the per-rank row path that many times (or, with ``loop``
    ``"telemetry"``, the telemetry path of one batch, with ``"watch"`` the stall report's watching of one step; see the
    module docstring) and keeps the time it took in :attr:`loop_ns` and
    :attr:`loop_cpu_ns`.
    """

    def __init__(self, row_loops: int = 0, loop_at: int = -1, synced: int = 1, loop: str = "rows") -> None:
        super().__init__()
        self.synced = synced
        self.net = torch.nn.Sequential(torch.nn.Linear(_FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.row_loops, self.loop_at, self.loop = row_loops, loop_at, loop
        self.loop_ns = self.loop_cpu_ns = self.loop_process_cpu_ns = 0
        self.memory_cpu_ns = 0.0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        prediction = self.net(x)
        loss = torch.nn.functional.mse_loss(prediction, y)
        mae = (prediction - y).abs().mean()
        self.log("train_loss", loss, on_step=True, on_epoch=False, sync_dist=True)
        for index in range(1, self.synced):
            self.log(f"train_loss_{index}", loss + index, on_step=True, on_epoch=False, sync_dist=True)
        self.log("train_mae", mae, on_step=True, on_epoch=False)
        if batch_idx == self.loop_at and self.row_loops:
            if self.loop == "telemetry":
                self._sample_loop()
            elif self.loop == "watch":
                self._watch_loop()
            else:
                self._row_loop(loss, mae)
        return loss

    def _sample_loop(self) -> None:
        """Run one batch's telemetry path ``row_loops`` times on this fit's objects, less the same loop bare (see the
        module docstring)."""
        telemetry = getattr(self.trainer.strategy, "_telemetry", None)
        if telemetry is None:
            raise RuntimeError("the sample loop needs a fit with per-rank telemetry")
        timer, wait = telemetry.timer, telemetry.gradient_wait
        weight = torch.ones(4, requires_grad=True)
        step = self.trainer.fit_loop.epoch_loop._batches_that_stepped + 1_000_000  # after every real row
        spent = []
        for sampled in (True, False):
            cpu, wall = thread_time_ns(), perf_counter_ns()
            for row in range(self.row_loops):
                loss = (weight * 2.0).sum()
                if not sampled:
                    torch.autograd.backward(loss)  # the backward pass without telemetry: subtracted
                    continue
                timer.begin_batch()
                for phase in (COLLECTIVES, DATA_WAIT):  # the broadcast at the batch's start, the fetch
                    timer.begin()
                    timer.end(phase)
                timer.begin()  # optimizer_step, around the closure
                timer.begin()  # training_step, with a synced value
                timer.begin()
                timer.end(COLLECTIVES)
                timer.end(FORWARD)
                timed_backward(wait, torch.Tensor.backward, loss)  # with the gradient all-reduce's wait marked
                timer.end(OPTIMIZER)
                timer.end_batch()
                telemetry.write_row(step + row)  # memory is read at most once a second: once or twice in this loop
            spent.append((perf_counter_ns() - wall, thread_time_ns() - cpu))
        (wall, cpu), (bare_wall, bare_cpu) = spent
        self.loop_ns, self.loop_cpu_ns = wall - bare_wall, cpu - bare_cpu
        readings = max(1, self.row_loops // 10)
        cpu = thread_time_ns()
        for _ in range(readings):
            telemetry.read_memory()
        self.memory_cpu_ns = (thread_time_ns() - cpu) / readings

    def _watch_loop(self) -> None:
        """Run one step's worth of the stall report's watching ``row_loops`` times, less the same loop bare."""
        recorder = facts._ACTIVE
        if recorder is None:
            raise RuntimeError("the watch loop needs a fit with the stall report")
        counted = [facts._counted(_no_collective, name) for name in ("all_reduce", "barrier", "broadcast")]
        bare = [_no_collective] * len(counted)
        spent = []
        for calls, noted in ((counted, recorder.backward_pass), (bare, _no_backward)):
            cpu, wall = thread_time_ns(), perf_counter_ns()
            for _ in range(self.row_loops):
                for call in calls:
                    call(None)
                with noted(True):
                    pass
            spent.append((perf_counter_ns() - wall, thread_time_ns() - cpu))
        self.loop_ns, self.loop_cpu_ns = spent[0][0] - spent[1][0], spent[0][1] - spent[1][1]

    def _row_loop(self, loss: torch.Tensor, mae: torch.Tensor) -> None:
        """Run the per-rank row path ``row_loops`` times on this fit's objects (see the module docstring)."""
        trainer = self.trainer
        results = trainer._results
        strategy = trainer.strategy
        rank_logger = strategy.rank_metrics_logger if isinstance(strategy, PolicyDDPStrategy) else None
        if results is None or rank_logger is None:
            raise RuntimeError("the row loop needs a fit with per-rank metrics")
        metrics = trainer._logger_connector.metrics["log"]  # the row Lightning builds for its loggers
        scalars = convert_tensors_to_scalars(metrics)
        loss_metric, mae_metric = results["training_step.train_loss"], results["training_step.train_mae"]
        step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1_000_000  # after every real row
        others = [sink for sink in rank_logger.sinks if sink is not rank_logger.csv]  # TensorBoard's, MLflow's, W&B's
        for sink in others:
            sink.flush()  # the fit's own rows are written before the timing starts
        process_cpu, cpu, wall = process_time_ns(), thread_time_ns(), perf_counter_ns()
        for row in range(self.row_loops):
            record_update(loss_metric, loss)
            record_update(mae_metric, mae)
            loggers_for(trainer, metrics)
            rank_logger.log_metrics(scalars, step + row)
            rank_logger.save()
        for sink in others:
            sink.flush()  # what the sinks still hold (TensorBoard: its writer thread's CRCs and appends)
        self.loop_ns, self.loop_cpu_ns = perf_counter_ns() - wall, thread_time_ns() - cpu
        self.loop_process_cpu_ns = process_time_ns() - process_cpu

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _no_collective(tensor: Any, group: Any = None) -> None:
    """What the watch loop's counted calls wrap: nothing to communicate (the collective itself is stock's)."""


def _no_backward(synced: bool) -> AbstractContextManager[None]:
    """The watch loop's bare counterpart of ``Recorder.backward_pass``."""
    return nullcontext()


class _SyncTimer:
    """Sums the time spent in ``torch.distributed.barrier`` and in lightning-ext's checks while installed."""

    def __init__(self) -> None:
        self.ns = 0

    def _timed(self, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = perf_counter_ns()
            try:
                return function(*args, **kwargs)
            finally:
                self.ns += perf_counter_ns() - start

        return timed

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Within the block, time every barrier and check."""
        barrier, agree = torch.distributed.barrier, Lockstep.agree
        torch.distributed.barrier = self._timed(barrier)
        Lockstep.agree = self._timed(agree)  # type: ignore[method-assign]
        try:
            yield
        finally:
            torch.distributed.barrier = barrier
            Lockstep.agree = agree  # type: ignore[method-assign]


class _StepClock(Callback):
    """Records the time (and, when counting, the collectives so far) at every ``on_train_batch_start``."""

    def __init__(self, counts: Counter[str] | None, sync: _SyncTimer | None = None) -> None:
        self.starts_ns: list[int] = []
        self.cpu_starts_ns: list[int] = []
        self.sync_ns: list[int] = []
        self.snapshots: list[Counter[str]] = []
        self._counts = counts
        self._sync = sync

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.cpu_starts_ns.append(thread_time_ns())
        self.starts_ns.append(perf_counter_ns())
        if self._sync is not None:
            self.sync_ns.append(self._sync.ns)
        if self._counts is not None:
            self.snapshots.append(Counter(self._counts))

    def windows_ns(self) -> list[int]:
        """The kept step times: consecutive starts, the first :data:`SKIP_STEPS` dropped."""
        return [b - a for a, b in zip(self.starts_ns, self.starts_ns[1:], strict=False)][SKIP_STEPS:]

    def cpu_windows_ns(self) -> list[int]:
        """The same windows in CPU time of the main thread."""
        return [b - a for a, b in zip(self.cpu_starts_ns, self.cpu_starts_ns[1:], strict=False)][SKIP_STEPS:]

    def sync_per_window_ns(self) -> float:
        """The mean time per kept window spent in barriers and checks."""
        kept = self.sync_ns[SKIP_STEPS:]
        return (kept[-1] - kept[0]) / (len(kept) - 1)


def _loader(world_size: int, batches: int, seed: int, stream: bool = False) -> "DataLoader[Any]":
    generator = torch.Generator().manual_seed(seed)
    size = world_size * batches * _BATCH
    data = TensorDataset(torch.randn(size, _FEATURES, generator=generator), torch.randn(size, 1, generator=generator))
    if stream:
        return DataLoader(_Shard(data, world_size), batch_size=_BATCH)
    return DataLoader(data, batch_size=_BATCH)  # Lightning adds a DistributedSampler: `batches` per rank


class _Shard(IterableDataset):  # type: ignore[type-arg]
    """The data as a stream without ``len``: each rank yields its own contiguous shard."""

    def __init__(self, data: TensorDataset, world_size: int) -> None:
        self.data, self.world_size = data, world_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        share = len(self.data) // self.world_size
        return (self.data[index] for index in range(rank * share, (rank + 1) * share))


def _fit(
    config: str, root: str, *, world_size: int, batches: int, seed: int, clock: _StepClock, row_loops: int = 0
) -> _SmallModel:
    stock = config.startswith("stock")
    strategy = DDPStrategy() if stock else PolicyDDPStrategy(**_OPTIONS[config])
    os.environ["WORLD_SIZE"] = str(world_size)  # LightningEnvironment.teardown removes it after every fit
    L.seed_everything(seed, verbose=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy=strategy,
        max_epochs=1,
        max_steps=batches,
        logger=_logger(config, root),
        log_every_n_steps=1,
        callbacks=[clock],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=root,
    )
    # the row loop runs at the last batch, after the last timed window
    loop = _LOOPS.get(config)
    loops = row_loops if loop else 0
    model = _SmallModel(loops, loop_at=batches - 1, synced=SYNCED.get(config, 1), loop=loop or "rows")
    context: AbstractContextManager[object] = stock_lightning() if stock else nullcontext()
    with context:
        trainer.fit(model, _loader(world_size, batches, seed, stream=config in _STREAMS))
    return model


def _logger(config: str, root: str) -> Logger:
    """The configuration's logger: its sink's for the sink configurations and their stock twins, else a CSVLogger."""
    kind = config.removeprefix("stock_")
    if kind == "tensorboard":
        return TensorBoardLogger(root)
    if kind == "mlflow":
        return MLFlowLogger(tracking_uri=f"file:{root}/mlruns")
    if kind == "wandb":
        return WandbLogger(project="lightning-ext-bench", save_dir=root)
    return CSVLogger(root)


def _open_mlflow_stores(roots: list[str]) -> None:
    """Rank 0 opens each fit's MLflow file store before any fit, then the ranks line up (not counted, not timed).

    Every rank builds an ``MLFlowLogger``'s client (stock Lightning), and a new file store writes its default
    experiment when first opened: two ranks opening it at once can collide on that file (mlflow's ``write_yaml``:
    "exists as"; docs/internals.md). It ended a full run once, in a stock fit.
    """
    if not roots:
        return
    if torch.distributed.get_rank() == 0:
        from mlflow.tracking import MlflowClient  # an extra: only the MLflow configurations need it

        for root in roots:
            MlflowClient(f"file:{root}/mlruns")
    torch.distributed.barrier()


def run_training(
    *,
    world_size: int,
    train_steps: int,
    repeats: int,
    seed: int,
    workdir: str,
    progress: Callable[[int], None],
    only: tuple[str, ...] = (),
) -> TrainingResult:
    """Count, then time, both configurations (see the module docstring); run on every rank of the session.

    Args:
        world_size: the number of ranks in the process group.
        train_steps: timed steps per fit (each fit runs :data:`SKIP_STEPS` + ``train_steps`` + 1 batches).
        repeats: timed fits per configuration.
        seed: the model, data and order seed.
        workdir: a directory shared by the ranks; each fit logs under its own subdirectory.
        progress: called with the number of steps just run.
        only: the configurations to run (``--training-configs``; their baselines are added by the caller); all if
            empty.

    """
    batches = SKIP_STEPS + train_steps + 1
    row_loops = ROW_LOOPS_PER_STEP * train_steps
    configs = tuple(config for config in CONFIGS if config in (only or CONFIGS))
    os.environ.update(_STORES)
    result = TrainingResult(
        step_ns={config: [] for config in configs},
        step_cpu_ns={config: [] for config in configs},
        sync_ns={config: [] for config in configs},
        row_loops=row_loops,
    )
    mlflow = [config for config in configs if config.removeprefix("stock_") == "mlflow"]
    _open_mlflow_stores(
        [os.path.join(workdir, f"count-{config}") for config in mlflow]
        + [os.path.join(workdir, f"time-{config}-{repeat}") for config in mlflow for repeat in range(repeats)]
    )
    for config in configs:
        with count_collectives() as counts:
            clock = _StepClock(counts)
            _fit(
                config,
                os.path.join(workdir, f"count-{config}"),
                world_size=world_size,
                batches=batches,
                seed=seed,
                clock=clock,
            )
        per_window = [after - before for before, after in zip(clock.snapshots, clock.snapshots[1:], strict=False)]
        kept = per_window[SKIP_STEPS:]
        total: Counter[str] = sum(kept, Counter())
        result.collectives_per_step[config] = {op: n / len(kept) for op, n in sorted(total.items())}
        result.fit_collectives[config] = dict(sorted(counts.items()))
        progress(batches)
    order = random.Random(seed)  # the same on every rank
    for repeat in range(repeats):
        for config in order.sample(configs, len(configs)):
            gc.collect()
            os.sync()  # the previous fit's file writes are not written back inside this one's steps
            sync = _SyncTimer()
            clock = _StepClock(None, sync)
            root = os.path.join(workdir, f"time-{config}-{repeat}")
            with sync.installed():
                model = _fit(
                    config, root, world_size=world_size, batches=batches, seed=seed, clock=clock, row_loops=row_loops
                )
            result.step_ns[config].append(clock.windows_ns())
            result.step_cpu_ns[config].append(clock.cpu_windows_ns())
            result.sync_ns[config].append(clock.sync_per_window_ns())
            if config == "per_rank_metrics":
                result.row_ns.append(model.loop_ns / row_loops)
                result.row_cpu_ns.append(model.loop_cpu_ns / row_loops)
            elif config == "tensorboard":
                result.events_row_ns.append(model.loop_ns / row_loops)
                result.events_row_cpu_ns.append(model.loop_cpu_ns / row_loops)
                result.events_row_process_cpu_ns.append(model.loop_process_cpu_ns / row_loops)
            elif config in SINKS:
                result.sink_row_ns.setdefault(config, []).append(model.loop_ns / row_loops)
                result.sink_row_process_cpu_ns.setdefault(config, []).append(model.loop_process_cpu_ns / row_loops)
            elif config == "telemetry":
                result.sample_ns.append(model.loop_ns / row_loops)
                result.sample_cpu_ns.append(model.loop_cpu_ns / row_loops)
                result.memory_cpu_ns.append(model.memory_cpu_ns)
            elif config == "stall_report":
                result.watch_ns.append(model.loop_ns / row_loops)
                result.watch_cpu_ns.append(model.loop_cpu_ns / row_loops)
            progress(batches)
    return result
