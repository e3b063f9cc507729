"""The coordinated stop on preemption, in real gloo groups of the rank pools: SIGTERM on some ranks at a random
training batch and hook stops every rank at the same point (before the same training step; in a validation, after the
same validation batch, unless it runs inside a gradient accumulation window), with a checkpoint that resumes to the
uninterrupted stock run's weights and rows.

The reference is Lightning's stock ``DDPStrategy`` run without any signal (tests/helpers/preemption_tasks.py): its
final weights, the steps where it validated (its own ``metrics.csv``), and each rank's local loss at each step
(recorded by a plain callback). Each rank's own file must hold, after stop and resume, exactly those steps and losses.
"""

from __future__ import annotations

import csv
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_ext import PolicyDDPStrategy, Quorum
from lightning_ext._preemption.stop import _other_handlers, resolve_preemption_policy
from tests.helpers import search
from tests.helpers.pool import RankPool
from tests.helpers.preemption_tasks import EPOCHS, PHASES, TRAIN_BATCHES, mark, rank_rows

TASKS = "tests.helpers.preemption_tasks"
BATCHES = EPOCHS * TRAIN_BATCHES
VALIDATED_AFTER = (2, 7)  # the training batches after which the validation runs (val_check_interval=3, 5 batches)
LATENCY = 3  # the stop comes at the first window end at most this many batches after the signalled one started


class _References:
    """The stock runs, one per (world size, accumulation), made when first needed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[tuple[int, int], tuple[list[Any], list[int]]] = {}

    def get(self, pool: RankPool, world_size: int, accumulate: int) -> tuple[list[Any], list[int]]:
        """Every rank's reference outcome, and the steps of the reference's validation rows."""
        if (world_size, accumulate) not in self.runs:
            directory = self.root / f"reference-{world_size}-{accumulate}"
            outcomes = pool.run(f"{TASKS}:reference", (str(directory), accumulate), timeout=120)
            with (directory / "run" / "metrics.csv").open() as handle:
                validated = [int(row["step"]) for row in csv.DictReader(handle) if row.get("val")]
            self.runs[world_size, accumulate] = (outcomes, validated)
        return self.runs[world_size, accumulate]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> _References:
    return _References(tmp_path_factory.mktemp("references"))


def _near(values: list[float], exact: bool) -> Any:
    return values if exact else pytest.approx(values, rel=1e-6, abs=1e-7)


def _window_end(batches: int, accumulate: int) -> bool:
    """Whether an optimizer step ends after ``batches`` training batches (the end of an epoch always steps)."""
    return (batches % TRAIN_BATCHES) % accumulate == 0 or batches % TRAIN_BATCHES == 0


def _check_resumed(references: _References, pool: RankPool, root: Path, accumulate: int, resumed: list[Any]) -> None:
    """Final weights and every rank's own rows equal the reference's."""
    world_size = pool.world_size
    reference, validated = references.get(pool, world_size, accumulate)
    # Two ranks' sums are exact in either order: bit-identical. With three, the last bit may differ (seen: 1 ulp),
    # likely because gloo's ring sums each gradient element in an order set by its place in DDP's bucket, and a
    # resumed process's new DDP syncs its first step before rebuilding its buckets as the uninterrupted run had.
    exact = world_size == 2
    for rank in range(world_size):
        assert resumed[rank]["weights"] == _near(reference[rank]["weights"], exact), f"rank {rank}"
        assert resumed[rank]["global_step"] == reference[rank]["global_step"]
        rows = rank_rows(str(root), rank)
        losses = dict(reference[rank]["losses"])  # a step's row holds its last batch's value (accumulation)
        assert [int(row["step"]) for row in rows if row["loss"]] == list(losses), f"rank {rank}: {rows}"
        assert [float(row["loss"]) for row in rows if row["loss"]] == _near(list(losses.values()), exact)
        assert [float(row["mark"]) for row in rows if row["loss"]] == [mark(rank, step) for step in losses]
        assert [int(row["step"]) for row in rows if row["val"]] == validated, f"rank {rank}"


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("world_size", [2, 3])
@settings(max_examples=search.examples(search.PER_SUITE_FIT))
@given(
    accumulate=st.sampled_from([1, 2]),
    every_rank=st.booleans(),
    culprit=st.integers(0, 2),
    phase=st.sampled_from(PHASES),
    batch=st.integers(0, BATCHES - 1),
    checkpoint=st.sampled_from(["save_last", "default"]),
    data=st.data(),
)
def test_a_signal_at_a_random_step_stops_every_rank_together_and_resumes_to_the_reference(
    rank_pools: Any,
    references: _References,
    tmp_path_factory: pytest.TempPathFactory,
    world_size: int,
    accumulate: int,
    every_rank: bool,
    culprit: int,
    phase: str,
    batch: int,
    checkpoint: str,
    data: Any,
) -> None:
    if phase == "validation_step":
        batch = data.draw(st.sampled_from(VALIDATED_AFTER))
    pool = rank_pools(world_size)
    root = tmp_path_factory.mktemp("stop")
    signalled = range(world_size) if every_rank else [culprit % world_size]
    signals = {rank: (batch, phase) for rank in signalled}
    # each step waits 20 ms without the GIL, as a real step's device work does: rank 0's watchdog thread, which takes
    # the stop request, then gets the GIL at once (a pure-Python step of 5 ms can starve it for a few steps); from the
    # signalled batch on, each step takes SLOWED_STEP, so LATENCY steps are long enough on a loaded machine too
    args = (str(root), accumulate, checkpoint)
    stopped = pool.run(f"{TASKS}:ours", args, signals=signals, pause=0.02, timeout=120)

    codes = {outcome["code"] for outcome in stopped}
    at = {outcome["batches"] for outcome in stopped}
    assert len(codes) == 1 and len(at) == 1, f"the ranks did not stop together: {stopped}"
    (code,), (stop,) = codes, at
    if code is None:  # a request that came after the last training step started: the fit ends as usual
        assert stop == BATCHES and batch >= BATCHES - LATENCY, stopped
        _check_resumed(references, pool, root, accumulate, stopped)
        return
    assert code == 128 + signal.SIGTERM
    assert all(outcome["received_sigterm"] for outcome in stopped)
    assert batch < stop < BATCHES and _window_end(stop, accumulate), f"signal at batch {batch}, stop at {stop}"
    assert stop <= next(n for n in range(batch + LATENCY, BATCHES + LATENCY) if _window_end(n, accumulate))
    if phase == "validation_step" and _window_end(batch + 1, accumulate):
        # in the validation itself, within one batch (of SLOW_VALIDATION seconds) of the signalled one, its first
        assert stop == batch + 1, f"signal in the validation after batch {batch}, stop before batch {stop}"
        where = {(outcome["val_batches"], outcome["validation_ended"]) for outcome in stopped}
        assert where <= {(1, False), (2, False)}, where
    name = "last.ckpt" if checkpoint == "save_last" else "last-preempted.ckpt"
    found = list(root.rglob(name))
    assert len(found) == 1, f"{name} not written: {sorted(root.rglob('*.ckpt'))}"
    resumed = pool.run(f"{TASKS}:ours", (str(root), accumulate, checkpoint), resume=True, timeout=120)
    assert {outcome["code"] for outcome in resumed} == {None}
    _check_resumed(references, pool, root, accumulate, resumed)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("policy", "signalled", "stops"),
    [
        ("all", [1], False),
        ("all", [0, 1], True),
        ("rank_zero", [1], False),
        ("rank_zero", [0], True),
    ],
)
def test_the_policy_decides_whether_signalled_ranks_stop_the_run(
    rank_pools: Any, references: _References, tmp_path: Path, policy: str, signalled: list[int], stops: bool
) -> None:
    pool = rank_pools(2)
    signals = {rank: (1, "training_step") for rank in signalled}
    outcomes = pool.run(f"{TASKS}:ours", (str(tmp_path), 1, "save_last", policy), signals=signals, timeout=120)
    if stops:
        assert [outcome["code"] for outcome in outcomes] == [143, 143]
        assert len({outcome["batches"] for outcome in outcomes}) == 1
        return
    assert [outcome["code"] for outcome in outcomes] == [None, None], outcomes  # training went on to the end
    _check_resumed(references, pool, tmp_path, 1, outcomes)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_fsdp2_ranks_stop_together_and_resume_to_the_stock_model_parallel_run(rank_pools: Any, tmp_path: Path) -> None:
    pool = rank_pools(2)
    reference = pool.run(f"{TASKS}:reference", (str(tmp_path / "reference"), 1, "model_parallel"), timeout=120)
    args = (str(tmp_path / "ours"), 1, "save_last")
    stopped = pool.run(f"{TASKS}:ours", args, signals={1: (3, "training_step")}, kind="model_parallel", timeout=120)
    assert [outcome["code"] for outcome in stopped] == [143, 143]
    assert stopped[0]["batches"] == stopped[1]["batches"] > 3
    resumed = pool.run(f"{TASKS}:ours", args, resume=True, kind="model_parallel", timeout=120)
    assert [outcome["weights"] for outcome in resumed] == [outcome["weights"] for outcome in reference]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_without_the_hang_checks_the_stall_reports_watchdog_carries_the_stop(rank_pools: Any, tmp_path: Path) -> None:
    """``hang_checks=False`` with the default stall report: the stop request still reaches rank 0, and resumes."""
    pool = rank_pools(2)
    reference = pool.run(f"{TASKS}:reference", (str(tmp_path / "reference"), 1, "ddp"), timeout=120)
    args = (str(tmp_path / "ours"), 1, "save_last")
    stopped = pool.run(f"{TASKS}:ours", args, signals={1: (3, "training_step")}, hang_checks=False, timeout=120)
    assert [outcome["code"] for outcome in stopped] == [143, 143]
    assert stopped[0]["batches"] == stopped[1]["batches"] > 3
    resumed = pool.run(f"{TASKS}:ours", args, resume=True, hang_checks=False, timeout=120)
    assert [outcome["weights"] for outcome in resumed] == [outcome["weights"] for outcome in reference]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_signal_that_did_not_stop_the_run_is_not_named_as_a_later_errors_cause(
    rank_pools: Any, tmp_path: Path
) -> None:
    pool = rank_pools(2)
    signals = {1: (1, "training_step")}
    outcomes = pool.run(f"{TASKS}:ours", (str(tmp_path), 1, "save_last", "all"), signals=signals, fail=(1, 4))
    assert outcomes[1]["error"] == "ValueError: boom on rank 1"
    assert outcomes[0]["error"].startswith("RankFailedError: Rank 1 failed with ValueError: boom on rank 1")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_armed_stop_makes_none_of_stocks_per_step_broadcasts(rank_pools: Any, tmp_path: Path) -> None:
    """Stock broadcasts rank 0's SIGTERM flag before every training batch; the armed stop makes no broadcast per step
    (the other broadcasts of a fit, Lightning's set-up and checkpoints, are stock's)."""
    pool = rank_pools(2)
    stock = pool.run(f"{TASKS}:broadcasts_per_fit", (str(tmp_path / "stock"), True), timeout=120)
    armed = pool.run(f"{TASKS}:broadcasts_per_fit", (str(tmp_path / "ours"), False), timeout=120)
    assert stock[0] - armed[0] == BATCHES and armed[0] == armed[1], (stock, armed)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_ranks_configured_with_different_or_impossible_policies_raise_alike_at_set_up(
    rank_pools: Any, tmp_path: Path
) -> None:
    pool = rank_pools(2)
    args = (str(tmp_path), 1, "save_last")
    differing = pool.run(f"{TASKS}:ours", (*args, "any"), (*args, "all"), timeout=120)
    for outcome in differing:
        assert outcome["error"].startswith("PolicyMismatchError"), outcome
        assert outcome["error"].splitlines()[0] == (
            "PolicyMismatchError: The strategy's preemption_policy differs between ranks: AnyRank() on rank 0, but"
            " AllRanks() on rank 1. Fix: pass the same options on every rank."
        )
    impossible = pool.run(f"{TASKS}:ours", (*args, Quorum(3)), timeout=120)
    assert [outcome["error"] for outcome in impossible] == [impossible[0]["error"]] * 2
    assert "preemption_policy=Quorum(k=3): Quorum(k=3) can never be met" in impossible[0]["error"]


def test_the_option_takes_vote_policies_and_refuses_the_rest() -> None:
    assert PolicyDDPStrategy().preemption_policy == resolve_preemption_policy("any")
    assert PolicyDDPStrategy(preemption_policy=Quorum(2)).preemption_policy == Quorum(2)
    assert PolicyDDPStrategy(preemption_policy=None).preemption_policy is None
    with pytest.raises(ValueError, match="preemption_policy='max' is an aggregate policy"):
        PolicyDDPStrategy(preemption_policy="max")
    with pytest.raises(TypeError):
        PolicyDDPStrategy(preemption_policy=3)  # type: ignore[arg-type]


def test_the_stop_runs_the_users_earlier_handler_but_not_lightnings_broadcasting_one() -> None:
    from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose, _SignalConnector

    connector = _SignalConnector(trainer=None)  # type: ignore[arg-type]  # its notifier would fail on a None trainer
    seen: list[int] = []
    compose = _HandlersCompose([connector._sigterm_notifier_fn, lambda number, frame: seen.append(number)])
    _other_handlers(compose, signal.SIGTERM, None)
    assert seen == [signal.SIGTERM] and not connector.received_sigterm
    _other_handlers(lambda number, frame: seen.append(-number), signal.SIGTERM, None)  # not Lightning's compose
    _other_handlers(signal.SIG_DFL, signal.SIGTERM, None)  # the default action is not taken: the stop ends the run
    assert seen == [signal.SIGTERM, -signal.SIGTERM]


def test_the_stop_skips_an_earlier_trainers_handlers_left_in_the_process_but_runs_the_users_inside_them() -> None:
    """A trainer whose teardown an error cut short leaves its compose installed; the next trainer's compose holds it
    (Lightning appends the handler it finds), and lightning-ext's note of that run holds it too. Its SIGTERM handler
    would broadcast on the signalled rank alone (its None trainer makes it raise here instead)."""
    from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose, _SignalConnector

    from lightning_ext._watch.facts import Recorder, _SignalNote

    seen: list[int] = []
    earlier, current = _SignalConnector(trainer=None), _SignalConnector(trainer=None)  # type: ignore[arg-type]
    stale = _HandlersCompose([earlier._sigterm_notifier_fn, lambda number, frame: seen.append(number)])
    _other_handlers(_HandlersCompose([current._sigterm_notifier_fn, stale]), signal.SIGTERM, None)
    stale_note = _SignalNote(Recorder(0, 2, None), "SIGTERM", stale)  # an earlier run's note, never given back
    _other_handlers(_HandlersCompose([current._sigterm_notifier_fn, stale_note]), signal.SIGTERM, None)
    assert seen == [signal.SIGTERM, signal.SIGTERM]
    assert not earlier.received_sigterm and not current.received_sigterm
