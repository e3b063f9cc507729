"""A preemption notice during an evaluation, in real gloo groups of the rank pools.

In a fit, SIGTERM on a random rank at a random batch of the sanity check or of a validation stops every rank at the
same evaluation batch, within one batch of the signalled one (the batches from it on take ``SLOW`` seconds: a stop
that waited for the validation's end would run four more), with the checkpoint of the last completed training step;
``ckpt_path="last"`` runs the interrupted validation again and ends with the uninterrupted stock run's weights, losses
and validation values, bit for bit (a bias-free layer: DDP's one bucket sums in the same order after the resume). Its
validation batches make no call on the training group and as many host-device synchronizations as stock's.
``validate``, ``test`` and ``predict`` end on every rank with ``RankSignalledError`` within one batch.
The reference is Lightning's stock ``DDPStrategy`` run without a signal (tests/helpers/evaluation_stop_tasks.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from tests.helpers import search
from tests.helpers.evaluation_stop_tasks import EPOCHS, SANITY, TRAIN_BATCHES, VAL_BATCHES, VAL_EVERY

TASKS = "tests.helpers.evaluation_stop_tasks"
RUNS = EPOCHS * TRAIN_BATCHES // VAL_EVERY  # the fit's validations, after the sanity check (run 0)
# from the signal to the last rank's stop: the stop comes within one or two batches of SLOW seconds; only a stop that
# never comes (a hang) takes this long
HANG = 60.0
PLACES = {
    "validate": "validation of epoch 0 (val dataloader 0: {batches} batch(es))",
    "test": "testing of epoch 0 (test dataloader 0: {batches} batch(es))",
    "predict": "predict of epoch 0",
}


@pytest.fixture(scope="module")
def references(rank_pools: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """The stock run at each world size, made when first needed."""
    made: dict[int, list[dict[str, Any]]] = {}

    class _Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, world: int) -> list[dict[str, Any]]:
            root = tmp_path_factory.mktemp(f"reference-{world}")
            made[world] = rank_pools(world).run(f"{TASKS}:reference", (str(root),), timeout=180)
            return made[world]

    return _Lazy()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [2, 4])
def test_a_signal_in_an_evaluation_stops_every_rank_within_one_batch_and_resumes_to_the_reference(
    rank_pools: Any, references: dict[int, list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory, world: int
) -> None:
    @settings(max_examples=search.examples(2))
    @given(data=st.data())
    def check(data: Any) -> None:
        rank = data.draw(st.integers(0, world - 1), label="rank")
        run = data.draw(st.integers(0, RUNS), label="validation run (0: the sanity check)")
        batch = data.draw(st.integers(0, (SANITY if run == 0 else VAL_BATCHES) - 1), label="batch")
        pool, root = rank_pools(world), tmp_path_factory.mktemp("stop")
        stopped = pool.run(f"{TASKS}:ours", (str(root), (rank, run, batch)), timeout=240)
        note(f"stopped: {[(outcome['runs'], outcome['train_started']) for outcome in stopped]}")
        assert [outcome["code"] for outcome in stopped] == [143] * world, stopped
        assert all(outcome["received_sigterm"] for outcome in stopped)
        places = {(str(outcome["runs"]), outcome["train_started"]) for outcome in stopped}
        assert len(places) == 1, f"the ranks stopped at different points: {places}"
        runs = stopped[0]["runs"]
        assert len(runs) == run + 1, f"a validation after the signalled one ran: {runs}"
        done, limit = runs[run][1], SANITY if run == 0 else VAL_BATCHES
        # within one batch: the signalled batch's end, or the next one's (or, after the last batch, the next point)
        assert batch + 1 <= done <= min(batch + 2, limit), f"signalled in batch {batch}, stopped after {done}"
        waited = max(outcome["stop_time"] for outcome in stopped) - stopped[rank]["signal_time"]
        print(f"SIGTERM to rank {rank} in batch {batch} of run {run}: stopped after {done}, {waited:.1f} s later")
        assert waited < HANG

        resumed = pool.run(f"{TASKS}:ours", (str(root),), resume=True, timeout=240)
        reference = references[world]
        for one in range(world):
            assert resumed[one]["code"] is None
            assert resumed[one]["weights"] == reference[one]["weights"], f"rank {one}"
            assert resumed[one]["global_step"] == reference[one]["global_step"]
            assert stopped[one]["losses"] + resumed[one]["losses"] == reference[one]["losses"], f"rank {one}"
            assert stopped[one]["vals"] + resumed[one]["vals"] == reference[one]["vals"], f"rank {one}"
            if run > 0:  # the interrupted validation, run again in full before the next training step
                assert resumed[one]["runs"][0] == [False, VAL_BATCHES], resumed[one]["runs"]
            # the stop adds no call on the training group in a validation batch: there, only the synced values' one
            # all-reduce after their check (stock: a barrier and an all-reduce per value); as many host syncs as stock's
            counts = dict(resumed[one]["counts"])
            assert counts.pop("host_sync", 0) == reference[one]["counts"].get("host_sync", 0), resumed[one]["counts"]
            assert set(counts) <= {"check", "all_reduce"}, counts
            assert counts.get("all_reduce", 0) <= counts.get("check", 0), counts

    check()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_a_signal_in_validate_test_or_predict_ends_every_rank_with_rank_signalled_error_within_one_batch(
    rank_pools: Any, tmp_path_factory: pytest.TempPathFactory, stage: str
) -> None:
    world = 2

    @settings(max_examples=search.examples(1))
    @given(rank=st.integers(0, world - 1), batch=st.integers(0, VAL_BATCHES - 2))
    def check(rank: int, batch: int) -> None:
        root = tmp_path_factory.mktemp(stage)
        outcomes = rank_pools(world).run(f"{TASKS}:evaluate", (str(root), stage, (rank, batch)), timeout=240)
        where = PLACES[stage].format(batches=batch + 1)  # the batch in progress counts
        first = (
            f"RankSignalledError: Rank {rank} received SIGTERM in {where}, and the other ranks did not (a preemption"
            " notice, a scheduler's or a user's `kill`): the job would hang."
        )
        for one, outcome in enumerate(outcomes):
            assert outcome["error"] == first, (one, outcome)
            # the signalled rank raises in its batch; the others once it ends, or at the next one's check
            assert batch <= outcome["completed"] <= batch + (0 if one == rank else 1), (one, outcome)
        assert max(outcome["end"] for outcome in outcomes) - outcomes[rank]["signal_time"] < HANG

    check()
