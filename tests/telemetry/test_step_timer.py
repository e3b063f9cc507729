"""The step timer's arithmetic on a clock the test controls, the wait at the end of a backward pass as autograd
orders it, and telemetry stepping aside on a changed Lightning."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lightning_ext import PerRankMetrics
from lightning_ext._per_rank.logger import RankMetricsLogger
from lightning_ext._telemetry import step_timer
from lightning_ext._telemetry.step_timer import (
    BACKWARD,
    COLLECTIVES,
    FORWARD,
    OPTIMIZER,
    GradientWait,
    StepTimer,
    timed,
    timed_backward,
)
from lightning_ext._telemetry.telemetry import Telemetry
from lightning_ext.errors import RankMetricsWarning

MS = 1_000_000  # ns


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    now = [0]
    monkeypatch.setattr(step_timer, "perf_counter_ns", lambda: now[0])
    return now


def test_nested_phases_count_their_own_time_once(clock: list[int]) -> None:
    """An automatic-optimization batch: optimizer_step holds the closure (forward with a synced log, backward)."""
    timer = StepTimer()
    assert not timer.begin()  # outside a batch: not timed (validation's collectives)
    for _ in range(2):
        timer.begin_batch()
        clock[0] += 1 * MS  # fetch, transfer, hooks: "other"
        assert timer.begin()  # optimizer_step
        clock[0] += 1 * MS  # zero_grad
        timer.begin()  # training_step
        clock[0] += 3 * MS
        timer.begin()  # reduce, inside training_step
        clock[0] += 5 * MS
        timer.end(COLLECTIVES)
        clock[0] += 2 * MS
        timer.end(FORWARD)
        timed(timer, BACKWARD, lambda: clock.__setitem__(0, clock[0] + 7 * MS))
        clock[0] += 4 * MS  # clipping, optimizer.step()
        timer.end(OPTIMIZER)
        clock[0] += 1 * MS  # batch-end hooks, logging
        timer.end_batch()
    row = timer.take()
    assert row == {
        "telemetry/step_s": 0.024,
        "telemetry/data_wait_s": 0.0,
        "telemetry/forward_s": 0.005,
        "telemetry/backward_s": 0.007,
        "telemetry/optimizer_s": 0.005,
        "telemetry/collectives_s": 0.005,
        "telemetry/gradient_wait_s": 0.0,
    }
    assert timer.take() == {}  # taken: a new interval starts


def test_a_batch_that_did_not_run_is_not_counted(clock: list[int]) -> None:
    timer = StepTimer()
    timer.begin_batch()
    clock[0] += 9 * MS  # the fetch found the data exhausted
    timer.end_batch(count=False)
    assert timer.take() == {}


def test_a_lightning_without_the_loop_methods_gets_one_warning_not_an_error(tmp_path: Path) -> None:
    logger = RankMetricsLogger(str(tmp_path), 0, PerRankMetrics(telemetry=True))
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace()), log_every_n_steps=50)
    watch = Telemetry(logger, 0, None)
    with pytest.warns(RankMetricsWarning, match=r"telemetry of rank 0 stopped: AttributeError: .* \(while starting\)"):
        watch.attach(trainer)
    watch.detach()  # nothing was attached: nothing to undo
    assert not (tmp_path / "rank_0").exists()


def _backward(clock: list[int], timer: StepTimer, *, finalize_ms: int, after_ms: int, queue_finalize: bool) -> None:
    """One backward pass timed as the strategy times it: 3 ms of graph, then what DDP's reducer queues when its last
    bucket is ready (``finalize_backward``: here ``finalize_ms`` of waiting), then ``after_ms`` of hooks after the
    graph (``on_after_backward``)."""
    engine = torch.autograd.Variable._execution_engine
    weight = torch.ones(3, requires_grad=True)

    def finalize() -> None:  # as DDP's reducer: queued from the last gradient's hook, during the graph
        clock[0] += finalize_ms * MS

    def gradient_ready(grad: torch.Tensor) -> torch.Tensor:
        clock[0] += 3 * MS  # the graph's computation
        if queue_finalize:
            engine.queue_callback(finalize)
        return grad

    weight.register_hook(gradient_ready)
    loss = (weight * 2.0).sum()

    def strategy_backward(closure_loss: torch.Tensor, optimizer: object) -> None:
        closure_loss.backward()
        clock[0] += after_ms * MS

    timed_backward(GradientWait(timer), strategy_backward, loss, None)


def test_the_wait_after_the_graph_counts_apart_from_the_backward_computation(clock: list[int]) -> None:
    timer = StepTimer()
    timer.begin_batch()
    _backward(clock, timer, finalize_ms=20, after_ms=2, queue_finalize=True)
    timer.end_batch()
    row = timer.take()
    assert row["telemetry/gradient_wait_s"] == 0.020  # the reducer's wait, and only it
    assert row["telemetry/backward_s"] == 0.005  # the graph and the hooks after it
    assert row["telemetry/step_s"] == 0.025


def test_without_a_reducer_the_backward_pass_waits_for_nothing(clock: list[int]) -> None:
    timer = StepTimer()
    timer.begin_batch()
    _backward(clock, timer, finalize_ms=20, after_ms=0, queue_finalize=False)
    timer.end_batch()
    row = timer.take()
    assert (row["telemetry/gradient_wait_s"], row["telemetry/backward_s"]) == (0.0, 0.003)


def test_outside_a_batch_the_backward_pass_is_not_timed(clock: list[int]) -> None:
    timer = StepTimer()
    _backward(clock, timer, finalize_ms=20, after_ms=0, queue_finalize=True)
    assert timer.take() == {}
