"""Rank-pool tasks for the straggler verdict: training steps timed by telemetry's own instruments, on real collectives.

:func:`timed_steps` runs the steps of a training loop as Lightning runs them under DDP (the broadcast at each batch's
start, the fetch, ``optimizer_step`` holding the closure: ``training_step`` with a synced value, the backward pass with
DDP's gradient all-reduce, ``optimizer.step()``, then the batch's hooks), timed as the strategy times them
(``StepTimer``, ``GradientWait``), with one rank made slower by ``delay`` seconds in one phase. It is fast enough for
a property test (a Trainer's fit costs seconds). :func:`gradient_waits` compares the wait telemetry measures at the end
of each backward pass with what DDP's reducer itself records (``_get_ddp_logging_data``), iteration by iteration.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lightning_ext._telemetry.step_timer import (
    COLLECTIVES,
    DATA_WAIT,
    FORWARD,
    OPTIMIZER,
    GradientWait,
    StepTimer,
    timed,
    timed_backward,
    timing,
)

_MODELS: dict[str, tuple[DistributedDataParallel, torch.optim.Optimizer]] = {}  # one per process and use


class _SleepInBackward(torch.autograd.Function):
    """The identity; its backward sleeps ``seconds`` first (a slower backward computation, before any gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.seconds:
            time.sleep(ctx.seconds)
        return grad, None


def _model(use: str) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    if use not in _MODELS:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        model = DistributedDataParallel(net)
        _MODELS[use] = model, torch.optim.SGD(model.parameters(), lr=0.001)
    return _MODELS[use]


def timed_steps(
    slow_rank: int, phase: str, delay: float, *, batches: int = 13, every: int = 2, base: float = 0.015
) -> list[tuple[int, dict[str, float]]]:
    """This rank's telemetry rows (``(step, {column: seconds})``, each the mean of ``every`` batches) over ``batches``
    steps; every rank loads its data for ``base`` seconds per batch; ``slow_rank`` spends ``delay`` seconds more per
    batch in ``phase`` (one of the verdict's phases)."""
    rank = dist.get_rank()
    extra = {phase: delay} if rank == slow_rank else {}
    model, optimizer = _model("steps")
    timer = StepTimer()
    wait = GradientWait(timer)
    flag = torch.zeros(1)
    rows = []
    for batch in range(batches):
        timer.begin_batch()
        with timing(timer, COLLECTIVES):  # Lightning's broadcast at each batch's start
            dist.broadcast(flag, src=0)
        with timing(timer, DATA_WAIT):
            time.sleep(base + extra.get("data loading", 0.0))
            inputs = torch.randn(8, 32)

        def training_step(inputs: torch.Tensor) -> torch.Tensor:
            output = _SleepInBackward.apply(model(inputs), extra.get("backward compute", 0.0))
            loss = output.pow(2).mean()
            time.sleep(extra.get("forward", 0.0))
            with timing(timer, COLLECTIVES):  # self.log("loss", loss, sync_dist=True)
                dist.all_reduce(loss.detach().clone())
            return loss

        with timing(timer, OPTIMIZER):  # optimizer_step holds the closure
            optimizer.zero_grad()
            loss = timed(timer, FORWARD, training_step, inputs)
            timed_backward(wait, torch.Tensor.backward, loss)
            time.sleep(extra.get("optimizer", 0.0))
            optimizer.step()
        time.sleep(extra.get("hooks and logging", 0.0))  # on_train_batch_end
        timer.end_batch()
        if (batch + 1) % every == 0:
            rows.append((batch, timer.take()))
    return rows


def gradient_waits(slow_rank: int, delay: float, iterations: int = 8) -> list[tuple[float, float]]:
    """``(telemetry's wait, DDP's own)`` in seconds for each backward pass but the last, ``slow_rank`` computing its
    backward ``delay`` seconds longer; DDP's own: its reducer's communication time less the part that overlapped its
    computation, recorded on every iteration (sample rate 1) and read at the next forward."""
    model, _ = _model("reducer")
    model._set_ddp_runtime_logging_sample_rate(1)
    timer = StepTimer()
    wait = GradientWait(timer)
    seconds = delay if dist.get_rank() == slow_rank else 0.0
    ours, theirs = [], []
    for iteration in range(iterations):
        output = model(torch.randn(8, 32))  # DDP records the previous iteration's times here
        if iteration:
            data = model._get_ddp_logging_data()
            theirs.append((data["backward_comm_time"] - data["backward_compute_comm_overlap_time"]) / 1e9)
        loss = _SleepInBackward.apply(output, seconds).sum()
        timer.begin_batch()
        timed_backward(wait, torch.Tensor.backward, loss)
        timer.end_batch()
        ours.append(timer.take()["telemetry/gradient_wait_s"])
    return list(zip(ours, theirs, strict=False))
