"""Real ``Trainer.fit`` runs on 2 and 3 CPU ranks (gloo), with un-synced, rank-dependent validation metrics.

The tables below make the policies disagree. The expected checkpoints and stop epochs were worked out by hand from
the rules in the README (a worked example is in the comment of each table); every run must also leave every rank
with the same agreed state.
"""

from __future__ import annotations

from typing import Any

import pytest

from lightning_ext import Quorum
from tests.helpers.decision_scenarios import CKPT, ES_TABLE_3, STEP_CKPT, STEP_TABLE, TABLE_3, assert_agreed

pytestmark = pytest.mark.slow

AGREED = ("best_model_path", "best_k_models", "kth_best_model_path", "last_model_path", "saves", "should_stop")

# ---- checkpoint decisions, 3 ranks, save_top_k=1, mode=min --------------------------------------------------------
# epoch:        0    1    2    3    4 (TABLE_3, in tests/helpers/decision_scenarios.py)
# Worked example, "majority": e0 first checkpoint (every rank votes yes). e1 votes (3<4, 5<4, 5<4) = (T,F,F): no.
# e2 vs own bests (4,4,4): (T,T,F): 2 of 3, save, named with rank 0's 3.5. e3 vs (3.5,3.5,4.5): (T,T,F): save.
# e4 vs (2,3,6): (F,T,T): save. "mean": 4.0, 4.33 (no), 3.83, 3.67, 2.50. "min": 4, 3, 3.5 (no), 2, 2.25 (no).
SAVES_3: dict[str, list[float | str]] = {
    "all": ["epoch=0-val_loss=4.00.ckpt", "epoch=4-val_loss=2.50.ckpt"],
    "any": [
        "epoch=0-val_loss=4.00.ckpt",
        "epoch=1-val_loss=3.00.ckpt",
        "epoch=2-val_loss=3.50.ckpt",
        "epoch=3-val_loss=2.00.ckpt",
        "epoch=4-val_loss=2.50.ckpt",
    ],
    "majority": [
        "epoch=0-val_loss=4.00.ckpt",
        "epoch=2-val_loss=3.50.ckpt",
        "epoch=3-val_loss=2.00.ckpt",
        "epoch=4-val_loss=2.50.ckpt",
    ],
    "rank_zero": ["epoch=0-val_loss=4.00.ckpt", "epoch=1-val_loss=3.00.ckpt", "epoch=3-val_loss=2.00.ckpt"],
    "mean": [
        "epoch=0-val_loss=4.00.ckpt",
        "epoch=2-val_loss=3.83.ckpt",
        "epoch=3-val_loss=3.67.ckpt",
        "epoch=4-val_loss=2.50.ckpt",
    ],
    "min": ["epoch=0-val_loss=4.00.ckpt", "epoch=1-val_loss=3.00.ckpt", "epoch=3-val_loss=2.00.ckpt"],
    "max": ["epoch=0-val_loss=4.00.ckpt", "epoch=4-val_loss=2.75.ckpt"],
}
SAVES_3["quorum2"] = SAVES_3["majority"]  # at 3 ranks, Quorum(2) is a majority

# ---- checkpoint decisions, 2 ranks ----------------------------------------------------------------------------------
TABLE_2 = [
    [4.0, 3.0, 3.5, 2.0],  # rank 0
    [4.0, 5.0, 4.5, 3.0],  # rank 1
]
# "any": e1 (T,F) save; e2 vs (3,5): (F,T) save, named 3.50 (rank 0's); e3 save. "mean": 4, 4 (no), 4 (no), 2.5.
SAVES_2: dict[str, list[float | str]] = {
    "all": ["epoch=0-val_loss=4.00.ckpt", "epoch=3-val_loss=2.00.ckpt"],
    "any": [
        "epoch=0-val_loss=4.00.ckpt",
        "epoch=1-val_loss=3.00.ckpt",
        "epoch=2-val_loss=3.50.ckpt",
        "epoch=3-val_loss=2.00.ckpt",
    ],
    "majority": ["epoch=0-val_loss=4.00.ckpt", "epoch=3-val_loss=2.00.ckpt"],  # strictly more than 1 of 2
    "rank_zero": ["epoch=0-val_loss=4.00.ckpt", "epoch=1-val_loss=3.00.ckpt", "epoch=3-val_loss=2.00.ckpt"],
    "mean": ["epoch=0-val_loss=4.00.ckpt", "epoch=3-val_loss=2.50.ckpt"],
    "min": ["epoch=0-val_loss=4.00.ckpt", "epoch=1-val_loss=3.00.ckpt", "epoch=3-val_loss=2.00.ckpt"],
    "max": ["epoch=0-val_loss=4.00.ckpt", "epoch=3-val_loss=3.00.ckpt"],
}
SAVES_2["quorum1"] = SAVES_2["any"]

# ---- early stopping, patience=1 (a rank votes to stop at its first epoch without improvement) ---------------------
# votes per epoch: e1 (F,T,F), e2 (F,T,T), e3 (T,F,T), e4 (T,T,T). mean: 10, 9.33, 9.5 (stop e2).
# min: 10, 8, 7.5, 7, 7.5 (stop e4). max: 10, 11 (stop e1).
STOP_3 = {"any": 1, "majority": 2, "quorum2": 2, "rank_zero": 3, "all": 4, "mean": 2, "min": 4, "max": 1}
ES_TABLE_2 = [
    [10.0, 9.0, 9.5, 9.6],  # rank 0 votes stop at e2, e3
    [10.0, 11.0, 12.0, 8.0],  # rank 1 votes stop at e1, e2
]
# votes: e1 (F,T), e2 (T,T). mean: 10, 10 (stop e1). min: 10, 9, 9.5 (stop e2). max: 10, 11 (stop e1).
STOP_2 = {"any": 1, "quorum1": 1, "majority": 2, "rank_zero": 2, "all": 2, "mean": 1, "min": 2, "max": 1}


def policy_spec(name: str) -> Any:
    if name.startswith("quorum"):
        return Quorum(int(name[len("quorum") :]))
    return name


@pytest.mark.parametrize(
    ("table", "expected"),
    [pytest.param(TABLE_2, SAVES_2, marks=pytest.mark.both_packages), (TABLE_3, SAVES_3)],
    ids=["2ranks", "3ranks"],
)
def test_checkpoint_policies_save_what_their_rule_says(
    rank_pools: Any, tmp_path: Any, table: Any, expected: Any
) -> None:
    world = len(table)
    pool = rank_pools(world)
    for name, saves in expected.items():
        root = str(tmp_path / name)
        strategy = {"checkpoint_policy": policy_spec(name)}
        results = pool.run(
            "tests.helpers.decision_scenarios:fit", (root, strategy, table), checkpoint=CKPT, max_epochs=len(table[0])
        )
        assert_agreed(results, AGREED)
        assert results[0]["saves"] == saves, name
        assert results[0]["files"] == [results[0]["best_model_path"]], name  # save_top_k=1: only the best is on disk
        if name in ("mean", "min", "max"):
            assert_agreed(results, ("best_model_score",))


@pytest.mark.parametrize(
    ("table", "expected"),
    [pytest.param(ES_TABLE_2, STOP_2, marks=pytest.mark.both_packages), (ES_TABLE_3, STOP_3)],
    ids=["2ranks", "3ranks"],
)
def test_early_stopping_policies_stop_when_their_rule_says(
    rank_pools: Any, tmp_path: Any, table: Any, expected: Any
) -> None:
    world = len(table)
    pool = rank_pools(world)
    stopping = {"monitor": "val_loss", "patience": 1, "mode": "min"}
    for name, epoch in expected.items():
        strategy = {"early_stopping_policy": policy_spec(name)}
        results = pool.run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path / name), strategy, table),
            early_stopping=stopping,
            max_epochs=6,
        )
        assert_agreed(results, ("should_stop", "stopped_epoch", "current_epoch"))
        assert results[0]["should_stop"] is True, name
        assert results[0]["stopped_epoch"] == epoch, name
        if name in ("mean", "min", "max"):
            assert_agreed(results, ("best_score", "wait_count", "stopping_reason"))


STOCK_CASES = {
    "k1_unsynced_3ranks": (TABLE_3, dict(CKPT), False),
    "k2_unsynced_2ranks": ([[5, 4, 4.5, 3, 3.5, 3.6], [5, 6, 3, 3.2, 3.1, 3.0]], dict(CKPT, save_top_k=2), False),
    "k3_synced_2ranks": ([[5, 4, 4.5, 3, 3.5, 3.6], [5, 6, 3, 3.2, 3.1, 3.0]], dict(CKPT, save_top_k=3), True),
    "k2_max_mode_3ranks": (TABLE_3, dict(CKPT, save_top_k=2, mode="max", save_last=True), False),
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.both_packages) if c == "k2_max_mode_3ranks" else c for c in STOCK_CASES],
)
def test_default_policies_save_and_stop_exactly_as_stock_ddp(rank_pools: Any, tmp_path: Any, case: str) -> None:
    """``PolicyDDPStrategy()`` saves the same checkpoints, and stops at the same epoch, as stock ``DDPStrategy``."""
    table, checkpoint, synced = STOCK_CASES[case]
    pool = rank_pools(len(table))
    stopping = {"monitor": "val_loss", "patience": 2, "mode": checkpoint.get("mode", "min")}
    runs = {}
    for label, strategy in (("stock", "stock"), ("policy", {})):
        runs[label] = pool.run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path / label), strategy, table),
            checkpoint=checkpoint,
            early_stopping=stopping,
            sync_dist=synced,
            max_epochs=len(table[0]),
        )
    stock, policy = runs["stock"], runs["policy"]
    assert [r["strategy"] for r in stock + policy] == ["DDPStrategy"] * len(table) + ["PolicyDDPStrategy"] * len(table)
    for key in (
        "files",
        "saves",
        "best_model_path",
        "best_k_models",
        "best_model_score",
        "stopped_epoch",
        "current_epoch",
    ):
        assert policy[0][key] == stock[0][key], key  # rank 0: what stock writes to disk
    assert_agreed(policy, (*AGREED, "stopped_epoch"))  # and every rank agrees with it


@pytest.mark.both_packages
def test_stock_ranks_disagree_on_paths_where_policy_ranks_agree(rank_pools: Any, tmp_path: Any) -> None:
    """The motivating bug: with the metric in the file name, stock ranks record different best paths."""
    pool = rank_pools(3)
    stock = pool.run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path / "stock"), "stock", TABLE_3),
        checkpoint=CKPT,
        max_epochs=5,
    )
    policy = pool.run(
        "tests.helpers.decision_scenarios:fit", (str(tmp_path / "policy"), {}, TABLE_3), checkpoint=CKPT, max_epochs=5
    )
    assert len({r["best_model_path"] for r in stock}) == 3  # epoch=4-val_loss=2.50 / 2.25 / 2.75
    assert {r["best_model_path"] for r in policy} == {"epoch=4-val_loss=2.50.ckpt"}


@pytest.mark.both_packages
def test_user_subclass_with_its_own_top_k_rule_votes_with_it(rank_pools: Any, tmp_path: Any) -> None:
    """A subclass overriding ``check_monitor_top_k`` keeps its rule: each rank votes with it."""
    # MarginCheckpoint saves only if current < best - 0.75. Own bests (4,4,4): e1 (3<3.25: T, F, F); under "any" save.
    # Then bests (3,5,5): e2 (3.5<2.25 F, 3.5<4.25 T, 4.5<4.25 F): save. Bests (3.5,3.5,4.5): e3 (2<2.75 T): save.
    # Bests (2,3,6): e4 (2.5<1.25 F, 2.25<2.25 F, 2.75<5.25 T): save.
    results = rank_pools(3).run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path), {"checkpoint_policy": "any"}, TABLE_3),
        checkpoint=CKPT,
        checkpoint_class="MarginCheckpoint",
        max_epochs=5,
    )
    assert_agreed(results, AGREED)
    assert results[0]["saves"] == SAVES_3["any"]
    majority = rank_pools(3).run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path / "majority"), {"checkpoint_policy": "majority"}, TABLE_3),
        checkpoint=CKPT,
        checkpoint_class="MarginCheckpoint",
        max_epochs=5,
    )
    # majority with the margin rule: e1 (T,F,F) no; e2 vs (4,4,4): (3.5<3.25 F, F, F) no; e3: (2<3.25 T, 3<3.25 T,
    # F): save; e4 vs (2,3,6): (F, 2.25<2.25 F, 2.75<5.25 T): no.
    assert majority[0]["saves"] == ["epoch=0-val_loss=4.00.ckpt", "epoch=3-val_loss=2.00.ckpt"]


# ---- step-based checkpoints (every_n_train_steps): decided where every rank arrives ------------------------------


@pytest.mark.both_packages
def test_step_based_checkpoints_follow_the_policy_and_defaults_match_stock(rank_pools: Any, tmp_path: Any) -> None:
    pool = rank_pools(2)
    runs = {}
    for label, strategy in (("stock", "stock"), ("defaults", {}), ("mean", {"checkpoint_policy": "mean"})):
        runs[label] = pool.run(
            "tests.helpers.decision_scenarios:fit",
            (str(tmp_path / label), strategy, []),
            checkpoint=STEP_CKPT,
            train_table=STEP_TABLE,
            max_epochs=5,
        )
    for key in ("files", "saves", "best_model_path"):
        assert runs["defaults"][0][key] == runs["stock"][0][key], key
    assert_agreed(runs["defaults"], AGREED)
    assert_agreed(runs["mean"], AGREED)
    # mean over the ranks: 4 (save), 4 (no), 3.25 (save), 2.5 (save), 2.375 (save)
    assert runs["mean"][0]["saves"] == [
        "step=1-train_metric=4.00.ckpt",
        "step=3-train_metric=3.25.ckpt",
        "step=4-train_metric=2.50.ckpt",
        "step=5-train_metric=2.38.ckpt",
    ]


@pytest.mark.both_packages
def test_vote_policy_records_rank_zero_value_even_when_it_is_worse(rank_pools: Any, tmp_path: Any) -> None:
    """docs/policies.md: the recorded score is rank 0's value, whatever rank 0 voted, so ``best_model_score`` can get
    worse. e1: rank 0 sees 5 (votes no), rank 1 sees 3 (votes yes); "any" saves, named and scored with rank 0's 5.00,
    and with save_top_k=1 that evicts the 4.00 checkpoint."""
    table = [[4.0, 5.0], [4.0, 3.0]]
    results = rank_pools(2).run(
        "tests.helpers.decision_scenarios:fit",
        (str(tmp_path), {"checkpoint_policy": "any"}, table),
        checkpoint=CKPT,
        max_epochs=2,
    )
    assert_agreed(results, (*AGREED, "best_model_score"))
    assert results[0]["saves"] == ["epoch=0-val_loss=4.00.ckpt", "epoch=1-val_loss=5.00.ckpt"]
    assert results[0]["best_model_score"] == 5.0
    assert results[0]["files"] == ["epoch=1-val_loss=5.00.ckpt"]
