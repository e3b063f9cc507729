"""A ``pytorch_lightning`` user's job (``tests/helpers/scripts/pytorch_lightning_user.py``): starting it, and what every
rank must end with, worked out by hand."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from lightning_ext import read_rank_metrics
from tests.helpers.jobs import REPO, Job, clean_env

SCRIPT = REPO / "tests" / "helpers" / "scripts" / "pytorch_lightning_user.py"
TABLE = [
    [4.0, 3.0, 3.5, 2.0],
    [4.0, 5.0, 4.5, 3.0],
]  # the script's val_loss per rank and epoch (copied, not read from it)
# Worked by hand. PolicyDDPStrategy(checkpoint_policy="mean", early_stopping_policy="majority"): the mean is 4.0, 4.0,
# 4.0, 2.5: saved at epochs 0 and 3, and save_top_k=1 keeps epoch 3. EarlyStopping(patience=2): rank 1 asks to stop
# at epoch 2 (no improvement at 1 and 2), rank 0 never (it improves at 1 and 3); 1 of 2 is no majority, so every
# epoch runs (stock "any" would stop at 2). "ddp_mean" stops on the mean too: 4.0 three times, so it stops at 2, and
# epoch 0 is its only save.
EXPECTED = {
    "object": {"best": "epoch=3-val_loss=2.50.ckpt", "saves": ["epoch=3-val_loss=2.50.ckpt"], "stopped_epoch": 0},
    "name": {"best": "epoch=0-val_loss=4.00.ckpt", "saves": ["epoch=0-val_loss=4.00.ckpt"], "stopped_epoch": 2},
}
STRATEGY = "lightning_ext.pytorch_lightning.strategies.ddp.PolicyDDPStrategy"
RUN_TIMEOUT = 180.0


def start(out: Path, **env: str) -> Job:
    out.mkdir(parents=True, exist_ok=True)
    return Job([sys.executable, str(SCRIPT), str(out)], clean_env(**env), out / "job.log", cwd=out)


def check_records(out: Path) -> list[dict[str, Any]]:
    """Every rank's record: the hand-worked outcome, the same on both ranks, and no `lightning` module imported."""
    records = [json.loads((out / f"rank_{rank}.json").read_text()) for rank in (0, 1)]
    for record in records:
        assert record["lightning"] == [], record  # a pytorch_lightning user's job never imports lightning
        for run, expected in EXPECTED.items():
            assert record[run]["strategy"] == STRATEGY
            assert {key: record[run][key] for key in expected} == expected, (run, record[run])
            assert record[run] == records[0][run]
    assert (
        records[0]["object"]["checkpoint_policy"]
        == records[0]["name"]["checkpoint_policy"]
        == "AggregatePolicy('mean')"
    )
    return records


def check_job(out: Path, code: int | None, log: str, installed: bool = True) -> None:
    """Two fits with the hand-worked outcomes and every rank's own file; then the pitfall: one error on both ranks.

    The error names the user's line only where ``pytorch_lightning`` is ``installed`` (in site-packages): a copy
    elsewhere counts as the user's own code for the hang checks, so they name its frame instead.
    """
    records = check_records(out)
    table = read_rank_metrics(records[0]["object"]["log_dir"])
    assert {rank: rows["val_loss"].dropna().tolist() for rank, rows in table.groupby("rank")} == dict(enumerate(TABLE))
    # rank 0 alone reads trainer.log_dir: the same error on both ranks, naming the call and the line
    assert code not in (None, 0), log
    line = next(n for n, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "print(self.trainer.log_dir)" in text)
    for rank in (0, 1):
        raised = re.findall(rf"^\[rank{rank}\]: lightning_ext\.errors\.(\w+): ", log, flags=re.MULTILINE)
        assert raised == ["DivergentCollectiveError"], log
    if installed:
        assert f"via Trainer.log_dir called from {SCRIPT}:{line} in validation_step" in log, log
