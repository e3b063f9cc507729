"""The stall rules, the summary and the report, in one process, on facts built by hand; and the options' errors."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from lightning_ext import PolicyDDPStrategy
from lightning_ext._stall.causes import is_stalled, report_text, summarize, thresholds, waits
from lightning_ext._stall.monitor import _append
from lightning_ext._stall.rank_report import RankReport, liveness
from lightning_ext._watch.progress import Progress
from lightning_ext._watch.rank_facts import Call, Facts

TRAINING = Progress(stage="train", epoch=0, train_batches=4)


def waiting_in_backward(rank: int, seconds: float, number: int = 4) -> RankReport:
    facts = Facts(rank, backward=number, backwards=number - 1, progress=TRAINING)
    return RankReport(rank, facts=facts, waiting=("backward", seconds), since_progress=seconds)


def computing(rank: int, seconds: float, stack: str = "", number: int = 4) -> RankReport:
    facts = Facts(rank, backwards=number - 1, progress=TRAINING, at="train.py:40 in training_step")
    stacks = (("MainThread (training thread)", stack),)
    return RankReport(rank, facts=facts, hook="training_step", since_progress=seconds, stacks=stacks)


def in_call(rank: int, seconds: float, index: int, group: str = "world", counts: int | None = None) -> RankReport:
    call = Call(group, index, "torch.distributed.all_reduce", "train.py:42 in training_step")
    facts = Facts(rank, counts={group: index if counts is None else counts}, inside=call, progress=TRAINING)
    return RankReport(rank, facts=facts, waiting=("collective", seconds), since_progress=seconds)


def test_the_default_reports_shortly_before_the_group_timeout_and_leaves_the_end_to_the_backend() -> None:
    def limits(stall_timeout: float | str, group_timeout: timedelta) -> tuple[float, bool]:
        chosen = thresholds(stall_timeout, group_timeout)
        return chosen.report_after, chosen.ends

    assert limits("auto", timedelta(minutes=30)) == (1740.0, False)  # 60 s before the timeout; ends when it fails
    assert limits("auto", timedelta(seconds=100)) == (90.0, False)  # a tenth of a short timeout
    assert limits(120, timedelta(minutes=30)) == (120.0, True)  # a number: report and end together


def test_a_backward_pass_is_a_wait_only_while_another_rank_has_not_started_it() -> None:
    ahead, behind = waiting_in_backward(0, 200.0), computing(1, 200.0)
    assert waits(ahead, [ahead, behind]) == 200.0
    both_in_it = waiting_in_backward(1, 200.0)
    assert waits(ahead, [ahead, both_in_it]) is None  # every rank computes that backward pass: nobody waits


def test_a_forward_pass_that_broadcasts_is_a_wait_only_while_another_rank_has_not_started_it() -> None:
    facts = Facts(0, forward=2, forwards=1, forward_syncs=("buffers",), progress=TRAINING)
    ahead = RankReport(0, facts=facts, waiting=("forward", 200.0), since_progress=200.0)
    assert waits(ahead, [ahead, computing(1, 200.0)]) == 200.0  # rank 1 completed 0 such passes
    with_it = RankReport(1, facts=Facts(1, forward=2, forwards=1, progress=TRAINING), waiting=("forward", 200.0))
    assert waits(ahead, [ahead, with_it]) is None
    past_it = RankReport(1, facts=Facts(1, forwards=2, progress=TRAINING), since_progress=1.0)
    assert waits(ahead, [ahead, past_it]) is None
    assert "DDP's broadcast of the module's buffers (forward pass #2)" in report_text(
        [ahead, computing(1, 200.0)], "the ranks stalled", ()
    )


@pytest.mark.parametrize(
    ("reports", "stalled"),
    [
        ([waiting_in_backward(0, 130.0), computing(1, 131.0)], True),
        ([waiting_in_backward(0, 130.0), computing(1, 30.0)], False),  # rank 1 progressed 30 s ago
        ([waiting_in_backward(0, 100.0), computing(1, 131.0)], False),  # nobody waited long enough
        ([waiting_in_backward(0, 130.0), RankReport(1, state="exited", detail="killed by SIGKILL")], True),
        ([in_call(0, 150.0, 7), in_call(1, 150.0, 7)], True),  # both in the same call: it does not complete
    ],
)
def test_a_stall_needs_a_long_wait_and_no_progress_anywhere(reports: list[RankReport], stalled: bool) -> None:
    assert is_stalled(reports, 120.0) is stalled


def test_a_checkpoint_write_is_progress_however_long() -> None:
    writing = RankReport(1, facts=Facts(1, progress=TRAINING), since_progress=500.0, busy=True)
    assert not is_stalled([waiting_in_backward(0, 500.0), writing], 120.0)


def test_the_summary_names_a_rank_that_is_gone() -> None:
    text, behind = summarize([waiting_in_backward(0, 3.0), RankReport(1, state="exited", detail="killed by SIGKILL")])
    assert behind == [1]
    assert text.startswith("Rank 1 is gone: killed by SIGKILL;")
    assert "rank 0 waits for it in DDP's gradient all-reduce (synced backward pass #4)" in text


def test_the_summary_names_a_call_that_the_other_ranks_never_made() -> None:
    odd = in_call(1, 130.0, 1, group="7")
    text, behind = summarize([waiting_in_backward(0, 130.0), odd])
    assert behind == [1]
    assert "Rank 1 is blocked in torch.distributed.all_reduce called from train.py:42 in training_step" in text
    assert "(its call #1 on process group '7'), which rank 0 never made" in text
    assert "rank 0 waits for it in DDP's gradient all-reduce" in text and "rank 1 waits" not in text


@pytest.mark.parametrize(
    ("stack", "doing"),
    [
        ("", "computing in training_step at train.py:40 in training_step"),
        (
            'File "/x/torch/utils/data/dataloader.py", line 1, in _get_data\n',
            "waiting for a batch from its DataLoader worker process(es)",
        ),
        (
            'File "/x/torch/distributed/distributed_c10d.py", line 9, in recv\n',
            "blocked in torch.distributed.recv in training_step",
        ),
        ('File "/x/torch/cuda/__init__.py", line 9, in synchronize\n', "waiting for the GPU"),
    ],
)
def test_the_summary_says_what_the_rank_behind_is_doing(stack: str, doing: str) -> None:
    text, behind = summarize([waiting_in_backward(0, 130.0), computing(1, 131.0, stack)])
    assert behind == [1]
    assert text.startswith("Rank 1 is behind: it has made no progress for 131 s, ")
    assert doing in text


def test_a_rank_that_does_not_answer_makes_no_progress_and_is_named() -> None:
    silent = RankReport(1, state="silent", detail="no answer in 5 s")
    assert is_stalled([waiting_in_backward(0, 130.0), silent], 120.0)
    text, behind = summarize([waiting_in_backward(0, 130.0), silent])
    assert behind == [1]
    assert text.startswith("Rank 1 does not answer: its process may have died")


def test_a_failed_collective_is_named_in_the_summary_with_where_its_rank_was() -> None:
    gone = RankReport(1, state="exited", detail="killed by SIGKILL")
    failing = RankReport(0, facts=Facts(0, progress=TRAINING), hook="backward", since_progress=1.0)
    text, _ = summarize([failing, gone], {0: "RuntimeError: reset by peer"})
    assert text == (
        "Rank 1 is gone: killed by SIGKILL; rank 0's collective call failed in backward, during training of epoch 0"
        " (4 training batch(es) so far) (RuntimeError: reset by peer)."
    )


def test_a_rank_whose_collective_timed_out_is_not_behind_the_rank_that_computes() -> None:
    # the process group's timeout came before the report (a loaded machine): rank 0's collective failed, so it no
    # longer waits, and rank 1 still computes in training_step (a CI run once read "different collectives" here)
    failing = RankReport(0, facts=Facts(0, backwards=3, progress=TRAINING), hook="backward", since_progress=14.0)
    text, behind = summarize([failing, computing(1, 14.0)], {0: "RuntimeError: Timed out waiting 15000ms"})
    assert behind == [1]
    assert text == (
        "Rank 1 is behind: it has made no progress for 14 s, computing in training_step at train.py:40 in"
        " training_step, during training of epoch 0 (4 training batch(es) so far); rank 0's collective call failed"
        " in backward, during training of epoch 0 (4 training batch(es) so far) (RuntimeError: Timed out waiting"
        " 15000ms)."
    )


def test_at_four_ranks_the_rank_that_computes_is_behind_whichever_others_failed_or_wait() -> None:
    failing = RankReport(0, facts=Facts(0, backwards=3, progress=TRAINING), hook="backward", since_progress=14.0)
    others = [waiting_in_backward(2, 14.0), waiting_in_backward(3, 14.0)]
    text, behind = summarize([failing, computing(1, 14.0), *others], {0: "RuntimeError: Timed out waiting 15000ms"})
    assert behind == [1]
    assert text.startswith("Rank 1 is behind: it has made no progress for 14 s, computing in training_step at")
    assert "rank 2 waits for it in" in text and "rank 0's collective call failed in backward" in text


def test_every_rank_in_the_same_call_blames_the_backend() -> None:
    text, behind = summarize([in_call(0, 150.0, 7), in_call(1, 150.0, 7)])
    assert behind == []
    assert "Every rank waits in torch.distributed.all_reduce" in text and "none is behind" in text


def test_the_report_has_every_rank_and_its_stacks() -> None:
    reports = [waiting_in_backward(0, 130.0), computing(1, 131.0, 'File "train.py", line 40, in training_step\n')]
    text = report_text(reports, "Rank 1 is behind.", ["header line"])
    for fragment in ("header line", "Summary: Rank 1 is behind.", "--- rank 0", "--- rank 1", "hook: training_step",
                     "waiting: DDP's gradient all-reduce (synced backward pass #4) for 130 s (pending)",
                     "thread MainThread (training thread):", 'File "train.py", line 40, in training_step'):  # fmt: skip
        assert fragment in text


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"stall_timeout": 0}, ValueError, "stall_timeout must be more than 0 seconds"),
        ({"stall_timeout": "soon"}, TypeError, "stall_timeout must be a number of seconds, 'auto' or None"),
        ({"on_stall": "ignore"}, ValueError, "on_stall must be 'error' or 'report'"),
        ({"stall_timeout": True}, TypeError, "stall_timeout must be a number of seconds, 'auto' or None"),
    ],
)
def test_bad_options_name_the_problem(options: dict[str, object], error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        PolicyDDPStrategy(**options)  # type: ignore[arg-type]


def test_a_rank_that_computes_is_behind_not_a_rank_that_waits_in_a_call_it_has_not_made_yet() -> None:
    text, behind = summarize([in_call(0, 130.0, 37), computing(1, 131.0)])  # rank 1: 36 calls on the group so far
    assert behind == [1]
    assert text.startswith("Rank 1 is behind: it has made no progress for 131 s, computing in training_step")
    waited = "torch.distributed.all_reduce called from train.py:42 in training_step (its call #37 on the default group)"
    assert f"rank 0 waits for it in {waited}" in text


def test_a_wait_is_worded_one_way_in_the_summary_and_the_sections_and_the_group_is_never_world() -> None:
    """The summary, a rank's ``waiting`` and its last call name a collective call as the checks' messages do."""
    broadcast = Call("world", 12, "torch.distributed.broadcast", "train.py:121 in main")
    waiting = dataclasses.replace(in_call(0, 130.0, 37), last_call=broadcast)
    text = report_text([waiting, computing(1, 131.0)], summarize([waiting, computing(1, 131.0)])[0], [])
    call = "torch.distributed.all_reduce called from train.py:42 in training_step (its call #37 on the default group)"
    assert f"rank 0 waits for it in {call} for 130 s" in text
    assert f"  waiting: {call} for 130 s (pending)" in text.splitlines()
    last = "torch.distributed.broadcast called from train.py:121 in main (its call #12 on the default group)"
    assert f"  last collective entered: {last} (completed)" in text.splitlines()
    assert " world" not in text


def test_a_rank_waiting_in_a_check_is_worded_with_what_the_check_stands_before() -> None:
    """A rank in a lightning-ext check waits there for the rank behind (the check's description, not its number)."""
    facts = Facts(0, check=(5, "a synced log of 'loss'"), checks=4, progress=TRAINING)
    waiting = RankReport(0, facts=facts, waiting=("check", 130.0), since_progress=130.0)
    text, behind = summarize([waiting, computing(1, 131.0)])
    assert behind == [1]
    assert "rank 0 waits for it in lightning-ext's check before a synced log of 'loss' for 130 s" in text


def test_a_report_that_cannot_be_written_warns_and_steps_aside(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    with pytest.warns(RuntimeWarning, match="could not write the stall report to .*stall_report.txt"):
        _append(str(not_a_directory / "stall_report.txt"), "the report")


def test_a_killed_child_is_named_by_its_signal_while_another_thread_is_reaping_it() -> None:
    """Rank 0 launched the child (Lightning's default launcher), and Lightning's child observer thread polls it too:
    while that thread holds the ``Popen``'s reaping lock, ``poll()`` says ``None`` for a child that is already gone
    (CI once named it "its process exited"). A real child, SIGKILLed; the other thread holds the lock a moment."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 120  # so generous only a defect breaks it (the kernel ends it at once)
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child did not end"
            time.sleep(0.01)
        held, release = threading.Event(), threading.Event()

        def observer() -> None:
            with child._waitpid_lock:  # what a concurrent poll() holds while it reaps
                held.set()
                release.wait(10)

        thread = threading.Thread(target=observer)
        thread.start()
        held.wait(10)
        threading.Timer(0.3, release.set).start()
        state = liveness(child.pid, "here", "here", {child.pid: child})
        thread.join(10)
        assert (state.alive, state.detail) == (False, "killed by SIGKILL")
    finally:
        child.kill()
        child.wait(10)
