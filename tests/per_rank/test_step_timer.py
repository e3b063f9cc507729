"""The step timer's arithmetic on a clock the test controls, and telemetry stepping aside on a changed Lightning."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_ext import PerRankMetrics
from lightning_ext._per_rank import telemetry
from lightning_ext._per_rank.logger import RankCSVLogger
from lightning_ext._per_rank.telemetry import BACKWARD, COLLECTIVES, FORWARD, OPTIMIZER, StepTimer, Telemetry, timed
from lightning_ext.errors import RankMetricsWarning

MS = 1_000_000  # ns


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    now = [0]
    monkeypatch.setattr(telemetry, "perf_counter_ns", lambda: now[0])
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
    }
    assert timer.take() == {}  # taken: a new interval starts


def test_a_batch_that_did_not_run_is_not_counted(clock: list[int]) -> None:
    timer = StepTimer()
    timer.begin_batch()
    clock[0] += 9 * MS  # the fetch found the data exhausted
    timer.end_batch(count=False)
    assert timer.take() == {}


def test_a_lightning_without_the_loop_methods_gets_one_warning_not_an_error(tmp_path: Path) -> None:
    logger = RankCSVLogger(str(tmp_path), 0, PerRankMetrics(telemetry=True))
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace()), log_every_n_steps=50)
    watch = Telemetry(logger, 0, None)
    with pytest.warns(RankMetricsWarning, match=r"telemetry of rank 0 stopped: AttributeError: .* \(while starting\)"):
        watch.attach(trainer)
    watch.detach()  # nothing was attached: nothing to undo
    assert not (tmp_path / "rank_0").exists()
