"""Non-finite monitored values in real ``Trainer.fit`` runs on 2 and 3 CPU ranks (gloo).

No such value ever wins a checkpoint. Under a vote policy the recorded score is rank 0's value, whatever rank 0
voted: the first tables give rank 0 a NaN or an infinity while the other ranks vote yes, so the policy says "save"
but the score that would be recorded is not finite, and nothing is saved; the real best stays best
(docs/policies.md, "Non-finite values"). A non-finite value on another rank only takes away that rank's vote. With
``EarlyStopping(check_finite=True)``, a non-finite value on any rank stops every rank.
"""

from __future__ import annotations

import math
from typing import Any

import lightning
import pytest
from lightning.pytorch.callbacks import early_stopping

from lightning_ext import Quorum
from tests.helpers.decision_scenarios import STEP_CKPT, assert_agreed

pytestmark = pytest.mark.slow

CKPT = {"monitor": "val_loss", "save_top_k": 1, "filename": "{epoch}-{val_loss:.2f}"}
AGREED = ("saves", "best_model_path", "best_k_models", "kth_best_model_path", "last_model_path", "best_model_score")
_RECORDS_REASONS = hasattr(early_stopping, "EarlyStoppingReason")  # new in Lightning 2.6
_SAVES_LAST_ONLY_AFTER_A_SAVE = not lightning.__version__.startswith("2.5.")
VOTES_FOR_SAVING = ["any", "majority", Quorum(2)]  # ranks 1 and 2 vote yes, rank 0 no: these policies say "save"


def _name(policy: Any) -> str:
    return policy if isinstance(policy, str) else repr(policy)


# mode=min. e0: the first checkpoint. e1: rank 0 sees a non-finite value, ranks 1 and 2 improve (2 < 4) and vote yes.
# e2: every rank improves on its own best (4): saved, named with rank 0's 3.00.
@pytest.mark.parametrize(
    "bad", [pytest.param(math.nan, marks=pytest.mark.both_packages), -math.inf], ids=["nan", "minus_inf"]
)
@pytest.mark.parametrize("policy", VOTES_FOR_SAVING, ids=_name)
def test_vote_save_with_non_finite_rank_zero_score_is_not_made(
    rank_pools: Any, tmp_path: Any, policy: Any, bad: float
) -> None:
    table = [[4.0, bad, 3.0], [4.0, 2.0, 2.5], [4.0, 2.0, 2.5]]
    results = rank_pools(3).run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path), {"checkpoint_policy": policy}, table),
        checkpoint=dict(CKPT, save_last=True),
        max_epochs=3,
    )
    assert_agreed(results, AGREED)
    # Lightning 2.6 saves last.ckpt only after a top-k save; 2.5 also after e1, where none was made
    e1 = [] if _SAVES_LAST_ONLY_AFTER_A_SAVE else ["last.ckpt"]
    e2 = ["epoch=2-val_loss=3.00.ckpt", "last.ckpt"]
    assert results[0]["saves"] == ["epoch=0-val_loss=4.00.ckpt", "last.ckpt", *e1, *e2]
    assert results[0]["best_model_path"] == "epoch=2-val_loss=3.00.ckpt"
    assert results[0]["best_model_score"] == 3.0
    assert results[0]["last_model_path"] == "last.ckpt"
    assert results[0]["files"] == ["epoch=2-val_loss=3.00.ckpt", "last.ckpt"]


@pytest.mark.parametrize("policy", VOTES_FOR_SAVING, ids=_name)
def test_non_finite_rank_zero_score_never_evicts_the_best(rank_pools: Any, tmp_path: Any, policy: Any) -> None:
    """The run ends right after rank 0's NaN: the one real checkpoint is still the best, and still on disk."""
    table = [[4.0, math.nan], [4.0, 2.0], [4.0, 2.0]]
    results = rank_pools(3).run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path), {"checkpoint_policy": policy}, table),
        checkpoint=CKPT,
        max_epochs=2,
    )
    assert_agreed(results, AGREED)
    assert results[0]["saves"] == ["epoch=0-val_loss=4.00.ckpt"]
    assert results[0]["best_model_path"] == "epoch=0-val_loss=4.00.ckpt"
    assert results[0]["best_model_score"] == 4.0
    assert results[0]["files"] == ["epoch=0-val_loss=4.00.ckpt"]


@pytest.mark.both_packages
def test_plus_inf_on_rank_zero_never_wins_in_max_mode(rank_pools: Any, tmp_path: Any) -> None:
    table = [[1.0, math.inf, 2.0], [1.0, 3.0, 2.5], [1.0, 3.0, 2.5]]
    results = rank_pools(3).run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path), {"checkpoint_policy": "any"}, table),
        checkpoint=dict(CKPT, mode="max", save_top_k=2),
        max_epochs=3,
    )
    assert_agreed(results, AGREED)
    assert results[0]["saves"] == ["epoch=0-val_loss=1.00.ckpt", "epoch=2-val_loss=2.00.ckpt"]
    assert results[0]["best_k_models"] == ["epoch=0-val_loss=1.00.ckpt", "epoch=2-val_loss=2.00.ckpt"]
    assert results[0]["best_model_score"] == 2.0


# train_metric per step, un-synced, saved every step ("{step}-{train_metric:.2f}"); rank 0 is NaN at the third step.
STEP_NAN_TABLE = [[4.0, 3.0, math.nan, 2.0], [4.0, 3.5, 2.0, 2.5]]


@pytest.mark.parametrize("policy", ["any", pytest.param("mean", marks=pytest.mark.both_packages)])
def test_step_based_save_never_records_a_non_finite_score(rank_pools: Any, tmp_path: Any, policy: str) -> None:
    # "any": s1 4 (first), s2 (3<4, 3.5<4) save 3.00, s3 rank 1 votes yes but rank 0's score is NaN: no save,
    # s4 (2<3, 2.5<3.5) save 2.00. "mean": 4, 3.25, NaN (no save), 2.25.
    results = rank_pools(2).run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path), {"checkpoint_policy": policy}, []),
        checkpoint=dict(STEP_CKPT, save_top_k=1),
        train_table=STEP_NAN_TABLE,
        max_epochs=4,
    )
    assert_agreed(results, AGREED)
    last = {"any": "2.00", "mean": "2.25"}[policy]
    second = {"any": "3.00", "mean": "3.25"}[policy]
    assert results[0]["saves"] == [
        "step=1-train_metric=4.00.ckpt",
        f"step=2-train_metric={second}.ckpt",
        f"step=4-train_metric={last}.ckpt",
    ]
    assert results[0]["files"] == [f"step=4-train_metric={last}.ckpt"]
    assert results[0]["best_model_score"] == float(last)


@pytest.mark.both_packages
def test_nan_on_another_rank_takes_away_its_vote_and_makes_the_aggregate_nan(rank_pools: Any, tmp_path: Any) -> None:
    # rank 1 turns NaN at epoch 1. "any": rank 0 (3 < 4) and rank 2 vote yes, rank 1's NaN votes no: save, named
    # with rank 0's 3.00. "all": NaN votes no: no save. "mean": the agreed value is NaN: no save.
    table = [[4.0, 3.0, 2.0], [4.0, math.nan, math.nan], [4.0, 3.5, 2.5]]
    pool = rank_pools(3)
    expected = {
        "any": ["epoch=0-val_loss=4.00.ckpt", "epoch=1-val_loss=3.00.ckpt", "epoch=2-val_loss=2.00.ckpt"],
        "all": ["epoch=0-val_loss=4.00.ckpt"],
        "mean": ["epoch=0-val_loss=4.00.ckpt"],
        "min": ["epoch=0-val_loss=4.00.ckpt"],  # NaN wins a min as in torch.min: the agreed value is NaN
    }
    for policy, saves in expected.items():
        results = pool.run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path / policy), {"checkpoint_policy": policy}, table),
            checkpoint=CKPT,
            max_epochs=3,
        )
        assert_agreed(results, ("saves", "best_model_path", "best_k_models"))
        assert results[0]["saves"] == saves, policy


@pytest.mark.parametrize(
    "policy", ["majority", "rank_zero", pytest.param("mean", marks=pytest.mark.both_packages), "max"]
)
def test_non_finite_on_one_rank_stops_every_rank_under_any_policy(rank_pools: Any, tmp_path: Any, policy: str) -> None:
    table = [[4.0, 3.0, 2.0, 1.0], [4.0, 3.0, math.inf, 1.0], [4.0, 3.0, 2.0, 1.0]]
    results = rank_pools(3).run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path), {"early_stopping_policy": policy}, table),
        early_stopping={"monitor": "val_loss", "patience": 5, "mode": "min"},
        max_epochs=4,
    )
    assert_agreed(results, ("should_stop", "stopped_epoch", "current_epoch"))
    assert results[0]["should_stop"] is True and results[0]["stopped_epoch"] == 2
    # Lightning 2.6 added EarlyStopping.stopping_reason; 2.5 records none
    assert results[1]["stopping_reason"] == ("NON_FINITE_METRIC" if _RECORDS_REASONS else None)
