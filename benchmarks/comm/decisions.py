"""Per-decision latency and collective counts, measured inside one rank of a running process group.

Subjects, for each path (``checkpoint``, ``early_stopping``):

* ``<path>/stock``: stock Lightning on a real ``DDPStrategy``. ``checkpoint``: ``ModelCheckpoint.check_monitor_top_k``
  in the state where it compares and calls ``reduce_boolean_decision``; ``early_stopping``:
  ``EarlyStopping._run_early_stopping_check``. Both run inside :func:`~benchmarks.comm.stock.stock_lightning`.
* ``<path>/<policy>`` for every built-in policy, on a ``PolicyDDPStrategy`` carrying it:
  :func:`lightning_ext._decisions.checkpoint.decide_top_k` on the same callback state, and
  :func:`lightning_ext._decisions.early_stopping.run_early_stopping_check`.

Each round runs every subject once, in an order shuffled with the same seed on every rank, with fresh random metric
values drawn per rank (about half of the ranks vote yes, so decisions vary). Before each timed call, an untimed
barrier lines the ranks up, so every subject starts from the same alignment. The timed region is the decision call
alone, with ``time.perf_counter_ns``. Warm-up rounds come first and are not kept. A few further rounds count each
subject's ``torch.distributed`` calls with :func:`benchmarks.helpers.collectives.count_collectives` (untimed).
"""

import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy

from benchmarks.comm.stock import policy_strategy, stock_lightning, stock_strategy
from benchmarks.helpers.collectives import count_bytes, count_collectives
from benchmarks.helpers.stand_ins import StandInTrainer
from lightning_ext import available_policies
from lightning_ext._collective import RankGroup
from lightning_ext._decisions.checkpoint import decide_top_k
from lightning_ext._decisions.early_stopping import run_early_stopping_check
from lightning_ext._decisions.record import top_k_before, topk_row
from lightning_ext._decisions.record_file import DecisionFile
from lightning_ext.strategies import PolicyDDPStrategy

__all__ = ["COUNT_ROUNDS", "DecisionResult", "decision_policies", "decision_subjects", "run_decisions"]

COUNT_ROUNDS = 5
_PREFERRED_ORDER = ("all", "any", "majority", "rank_zero", "mean", "min", "max")
_TOP_K_SCORES = (0.2, 0.35, 0.5)  # the recorded top-3 (mode "min"): a new value below 0.5 enters it
_BEST_SCORE = 0.5  # EarlyStopping's best so far (mode "min", patience 1): a value at or above it asks to stop
_PATHS = ("checkpoint", "early_stopping")


@dataclass
class DecisionResult:
    """What one rank measured.

    Attributes:
        samples_ns: per subject, the latency of every timed decision, in nanoseconds, in run order.
        collectives: per subject, the ``torch.distributed`` calls per decision, by name.
        received_bytes: per subject, the bytes of the tensors a rank's collectives fill, per decision.
        record_cpu_ns: rank 0's CPU time to build and write one decision-record row, once per timed checkpoint
            decision of a policy (the row's sentence, its cells, one ``os.write`` to a local ``decisions.csv``).

    """

    samples_ns: dict[str, list[int]] = field(default_factory=dict)
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)
    received_bytes: dict[str, float] = field(default_factory=dict)
    record_cpu_ns: list[int] = field(default_factory=list)


def decision_policies() -> list[str]:
    """Every built-in policy name, votes first, in a stable order."""
    names = available_policies()
    known = [name for name in _PREFERRED_ORDER if name in names]
    return known + sorted(set(names) - set(known))


def decision_subjects() -> list[str]:
    """The subject names, ``<path>/<stock or policy>``, in report order."""
    return [f"{path}/{name}" for path in _PATHS for name in ("stock", *decision_policies())]


@dataclass
class _Subject:
    name: str
    prepare: Callable[[float], None]  # untimed: fresh state and this round's metric value
    call: Callable[[], object]  # timed: the decision itself
    stock: bool
    record: Callable[[object], None] | None = None  # rank 0, after the timed call: write the decision's record row


def _checkpoint_callback() -> ModelCheckpoint:
    callback = ModelCheckpoint(dirpath="/nonexistent/lightning-ext-bench", monitor="val_loss", mode="min", save_top_k=3)
    callback.best_k_models = {f"/nonexistent/k{i}.ckpt": torch.tensor(s) for i, s in enumerate(_TOP_K_SCORES)}
    callback.kth_best_model_path = f"/nonexistent/k{len(_TOP_K_SCORES) - 1}.ckpt"
    callback.kth_value = torch.tensor(max(_TOP_K_SCORES))
    callback.best_model_path = "/nonexistent/k0.ckpt"
    callback.best_model_score = torch.tensor(min(_TOP_K_SCORES))
    return callback


def _checkpoint_subject(
    label: str, strategy: DDPStrategy, device: torch.device, record_file: DecisionFile | None = None
) -> _Subject:
    trainer: Any = StandInTrainer(strategy)
    callback = _checkpoint_callback()
    state: dict[str, dict[str, torch.Tensor]] = {}

    def prepare(value: float) -> None:
        current = torch.tensor(value, dtype=torch.float32, device=device)
        state["candidates"] = {"epoch": torch.tensor(0), "step": torch.tensor(0), "val_loss": current}

    if not isinstance(strategy, PolicyDDPStrategy):
        return _Subject(
            f"checkpoint/{label}",
            prepare,
            lambda: callback.check_monitor_top_k(trainer, state["candidates"]["val_loss"]),
            True,
        )
    policy = strategy.checkpoint_policy

    def call() -> object:
        return decide_top_k(RankGroup.from_strategy(strategy), policy, callback, trainer, state["candidates"])

    def record(decision: Any) -> None:  # what save_topk_checkpoint hands rank 0's record after a decision
        assert record_file is not None
        before = top_k_before(callback)
        agreement, wanted, score = decision.agreement, decision.wanted, float(decision.score)
        record_file.record(lambda: topk_row(callback, trainer, policy, agreement, wanted, False, score, before))

    return _Subject(f"checkpoint/{label}", prepare, call, False, record if record_file is not None else None)


def _early_stopping_subject(label: str, strategy: DDPStrategy, device: torch.device) -> _Subject:
    trainer: Any = StandInTrainer(strategy)
    callback = EarlyStopping(monitor="val_loss", mode="min", patience=1, verbose=False)

    def prepare(value: float) -> None:
        callback.best_score = torch.tensor(_BEST_SCORE, device=device)
        callback.wait_count = 0
        callback.stopped_epoch = 0
        trainer.should_stop = False
        trainer.callback_metrics = {"val_loss": torch.tensor(value, dtype=torch.float32, device=device)}

    if not isinstance(strategy, PolicyDDPStrategy):
        return _Subject(f"early_stopping/{label}", prepare, lambda: callback._run_early_stopping_check(trainer), True)
    return _Subject(f"early_stopping/{label}", prepare, lambda: run_early_stopping_check(callback, trainer), False)


def _subjects(device: torch.device, world_size: int, record_file: DecisionFile | None) -> list[_Subject]:
    """Every subject with its own callback and trainer stand-in; the policy subjects share one strategy per policy."""
    subjects = [
        _checkpoint_subject("stock", stock_strategy(device, world_size), device),
        _early_stopping_subject("stock", stock_strategy(device, world_size), device),
    ]
    for policy in decision_policies():
        strategy = policy_strategy(device, world_size, policy=policy)
        subjects += [
            _checkpoint_subject(policy, strategy, device, record_file),
            _early_stopping_subject(policy, strategy, device),
        ]
    return subjects


def run_decisions(
    device: torch.device,
    *,
    world_size: int,
    rank: int,
    decisions: int,
    warmup: int,
    seed: int,
    progress: Callable[[int], None],
) -> DecisionResult:
    """Warm up, count, then time every subject ``decisions`` times, interleaved (see the module docstring).

    Args:
        device: where the metric tensors and the strategies' root device live.
        world_size: the number of ranks in the process group.
        rank: this process's global rank.
        decisions: timed decisions per subject.
        warmup: untimed rounds before counting and timing.
        seed: seeds the subject order (same on every rank) and the metric values (different per rank).
        progress: called with the number of decisions just made (for the progress bar).

    """
    with tempfile.TemporaryDirectory() as directory:
        record_file = DecisionFile(directory, "benchmark") if rank == 0 else None
        result = _run(_subjects(device, world_size, record_file), decisions, warmup, seed, rank, progress)
        if record_file is not None:
            record_file.close()
    return result


def _run(
    subjects: list[_Subject], decisions: int, warmup: int, seed: int, rank: int, progress: Callable[[int], None]
) -> DecisionResult:
    order = random.Random(seed)
    values = random.Random(seed * 1_000_003 + rank + 1)
    result = DecisionResult(samples_ns={s.name: [] for s in subjects})
    counted: dict[str, Counter[str]] = {s.name: Counter() for s in subjects}
    sized: dict[str, Counter[str]] = {s.name: Counter() for s in subjects}
    phases = (("warmup", warmup), ("count", COUNT_ROUNDS), ("time", decisions))
    for phase, rounds in phases:
        for _ in range(rounds):
            checkpoint_value, stopping_value = values.random(), values.random()
            for subject in order.sample(subjects, len(subjects)):
                subject.prepare(checkpoint_value if subject.name.startswith("checkpoint/") else stopping_value)
                context: AbstractContextManager[object] = stock_lightning() if subject.stock else nullcontext()
                with context:
                    dist.barrier()  # untimed: every rank starts the decision together
                    if phase == "count":
                        with count_collectives() as counts, count_bytes() as sizes:
                            subject.call()
                        counted[subject.name].update(counts)
                        sized[subject.name].update(sizes)
                        continue
                    start = time.perf_counter_ns()
                    decision = subject.call()
                    elapsed = time.perf_counter_ns() - start
                if phase == "time":
                    result.samples_ns[subject.name].append(elapsed)
                    if subject.record is not None and decision is not None:
                        started = time.process_time_ns()
                        subject.record(decision)
                        result.record_cpu_ns.append(time.process_time_ns() - started)
            progress(len(subjects))
    result.collectives = {
        name: {op: n / COUNT_ROUNDS for op, n in sorted(counts.items())} for name, counts in counted.items()
    }
    result.received_bytes = {name: sizes.total() / COUNT_ROUNDS for name, sizes in sized.items()}
    return result
