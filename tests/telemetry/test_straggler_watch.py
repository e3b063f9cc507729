"""Rank 0's live straggler check in one process: when it judges, what it warns, and how often it reminds.

Its path through the watchdogs' mailboxes runs in real fits (``test_straggler_fits.py``); here a stand-in mailbox
serves the request at once, so the schedule and the reminders can be driven step by step.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_ext._telemetry import live_stragglers as straggler_watch
from lightning_ext._telemetry.live_stragglers import CHECK, WINDOW, StragglerWatch
from lightning_ext.errors import StragglerWarning


def _times(data: float, wait: float) -> dict[str, float]:
    parts = {"telemetry/data_wait_s": data, "telemetry/forward_s": 0.004, "telemetry/backward_s": 0.004,
             "telemetry/optimizer_s": 0.001, "telemetry/collectives_s": 0.0,
             "telemetry/gradient_wait_s": wait}  # fmt: skip
    return {"telemetry/step_s": sum(parts.values()) + 0.001, **parts}


class _Mailbox:
    """A stand-in for the watchdogs of two ranks: a notice to rank 0 is served at once, as its thread would."""

    def __init__(self, other: list[Any]) -> None:
        self.answers: dict[str, Any] = {}
        self.handlers: dict[str, Any] = {}
        self.other = other  # rank 1's rows
        self.asked = 0

    def notify(self, rank: int, kind: str, **fields: str) -> None:
        self.handlers[kind]({"type": kind, **fields})

    def ask_in_thread(self, ranks: list[int], kind: str, timeout: float) -> dict[int, Any]:
        self.asked += 1
        return {1: list(self.other)} if ranks == [1] and kind == WINDOW else {}


def _watch(mailbox: _Mailbox, rows: list[Any], rank: int = 0) -> tuple[StragglerWatch, Any]:
    telemetry = SimpleNamespace(window_rows=lambda: list(rows), row_written=None)
    watch = StragglerWatch(telemetry, mailbox, rank, 2, rows=4, reminder_s=1800.0, log_dir="logs/v0")  # type: ignore[arg-type]
    return watch, telemetry


def test_rank_0_judges_every_window_and_warns_at_its_next_row(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(straggler_watch.time, "monotonic", lambda: clock[0])
    rank_0 = [(step, _times(0.001, 0.04)) for step in range(1, 5)]  # rank 0 waits 40 ms for rank 1's data
    mailbox = _Mailbox([(step, _times(0.041, 0.0)) for step in range(1, 5)])
    watch, telemetry = _watch(mailbox, rank_0)
    assert mailbox.answers[WINDOW] == telemetry.window_rows and CHECK in mailbox.handlers
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            telemetry.row_written()
        assert mailbox.asked == 0  # not a window's rows yet
        telemetry.row_written()  # the 4th row: rank 0's watchdog judges
        assert mailbox.asked == 1 and caught == []  # the warning waits for the training thread's next row
        telemetry.row_written()
    assert [w.category for w in caught] == [StragglerWarning]
    assert str(caught[0].message) == (
        "Straggler: the other ranks are waiting for rank 1. In 4 of the last 4 telemetry rows (steps 1-4) it spent"
        " 40 ms more per batch than they did in data loading (41 ms against 1 ms), and they lost 78% of their step"
        " time waiting for it. After the run, `lightning-ext ranks logs/v0 --stragglers` gives the verdict of the"
        " whole run."
    )
    for _ in range(8):  # two more windows' rows within 30 s of the check: no check
        telemetry.row_written()
    assert mailbox.asked == 1
    watch.stop()
    assert mailbox.answers == {} and mailbox.handlers == {}


def test_a_straggler_is_warned_of_once_then_reminded_at_most_every_so_often() -> None:
    mailbox = _Mailbox([])
    watch, _ = _watch(mailbox, [])
    slow = {0: [(step, _times(0.001, 0.04)) for step in range(4)], 1: [(step, _times(0.041, 0.0)) for step in range(4)]}
    assert len(watch.judge(slow, now=0.0)) == 1
    assert watch.judge(slow, now=1799.0) == []  # within the reminder's interval
    reminder = watch.judge(slow, now=1800.0)
    assert len(reminder) == 1 and reminder[0].startswith("Straggler: the other ranks are still waiting for rank 1.")
    even = {rank: [(step, _times(0.001, 0.0)) for step in range(4)] for rank in range(2)}
    assert watch.judge(even, now=5000.0) == []


def test_a_straggler_only_in_bursts_is_not_warned_of_during_training() -> None:
    """The warning is for a rank the others have been waiting for in most of the window's rows."""
    watch, _ = _watch(_Mailbox([]), [])
    rows = {0: [(step, _times(0.001, 0.04 if step == 3 else 0.0)) for step in range(10)],
            1: [(step, _times(0.041 if step == 3 else 0.001, 0.0)) for step in range(10)]}  # fmt: skip
    assert watch.judge(rows, now=0.0) == []


def test_the_other_ranks_only_answer() -> None:
    mailbox = _Mailbox([])
    _, telemetry = _watch(mailbox, [(1, _times(0.001, 0.0))], rank=1)
    assert mailbox.answers[WINDOW]() == [(1, _times(0.001, 0.0))] and mailbox.handlers == {}
    assert telemetry.row_written is None  # rank 1 does not judge


def test_a_warning_found_as_the_fit_ends_is_given_at_teardown() -> None:
    rank_0 = [(step, _times(0.001, 0.04)) for step in range(1, 5)]
    mailbox = _Mailbox([(step, _times(0.041, 0.0)) for step in range(1, 5)])
    watch, telemetry = _watch(mailbox, rank_0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            telemetry.row_written()  # the last row of the fit: rank 0's watchdog judges
        assert caught == []
        watch.stop()
    assert [w.category for w in caught] == [StragglerWarning]


def test_rank_0_judges_without_importing_pandas() -> None:
    """Importing pandas holds the interpreter for about half a second: on rank 0's watchdog thread, during training, it
    would hold rank 0's steps back (a job that does not import ``PerRankMetrics`` has not imported pandas)."""
    code = textwrap.dedent(
        """
        import sys
        from types import SimpleNamespace
        from lightning_ext._telemetry.live_stragglers import StragglerWatch

        def times(data, wait):
            parts = {"telemetry/data_wait_s": data, "telemetry/forward_s": 0.004, "telemetry/backward_s": 0.004,
                     "telemetry/optimizer_s": 0.001, "telemetry/collectives_s": 0.0, "telemetry/gradient_wait_s": wait}
            return {"telemetry/step_s": sum(parts.values()) + 0.001, **parts}

        telemetry = SimpleNamespace(window_rows=list, row_written=None)
        mailbox = SimpleNamespace(answers={}, handlers={})
        watch = StragglerWatch(telemetry, mailbox, 0, 2, rows=4, reminder_s=1800.0, log_dir="logs/v0")
        windows = {0: [(step, times(0.001, 0.04)) for step in range(1, 5)],
                   1: [(step, times(0.041, 0.0)) for step in range(1, 5)]}
        (warning,) = watch.judge(windows, now=0.0)
        print(warning.split(". ")[0], "pandas" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Straggler: the other ranks are waiting for rank 1 False"
