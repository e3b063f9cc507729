"""A user's training script that a scheduler preempts: launched for real by
tests/preemption/test_preemption_launched.py.

Usage: ``python preemption_job.py ROOT`` (Lightning's default launcher, 2 ranks), under ``torchrun``, or once per rank
with SLURM's variables set (as ``srun`` would start it).
The first attempt trains slowly (each rank writes ``ROOT/batch_0_<rank>``: its pid, and how many training batches it
has started) so that the test can signal one rank's process; ``RESUME=1`` resumes with ``ckpt_path="last"``. Every
rank writes ``ROOT/outcome_<attempt>_<rank>.json``: its exit code (``null``: it ended normally), the batches it
completed, its final weights; then it exits as the stop made it exit.
"""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_ext import PerRankMetrics, PolicyDDPStrategy
from tests.helpers.preemption_tasks import Model, trainer_for, weights

STEP_SECONDS = 0.3  # slow enough for the test to signal a rank mid-run


class Pace(L.Callback):
    """Slows each training batch and says which batch each rank starts."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.marker.write_text(f"{os.getpid()} {trainer.fit_loop.epoch_loop.batch_progress.total.ready}")
        time.sleep(STEP_SECONDS)


def main() -> None:
    root = Path(sys.argv[1])
    attempt = int(os.environ.get("RESUME", "0"))
    # under popen rank 0 has no rank variable yet (its children get LOCAL_RANK); srun sets SLURM_PROCID
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("LOCAL_RANK", "0")))
    strategy = PolicyDDPStrategy(process_group_backend="gloo", per_rank_metrics=PerRankMetrics(flush_every_n_rows=1000))
    callbacks = [Pace(root / f"batch_0_{rank}")] if attempt == 0 else []
    trainer = trainer_for(str(root), strategy, 1, "save_last", callbacks)
    model = Model()
    outcome: dict[str, Any] = {"code": None}
    try:
        trainer.fit(model, ckpt_path="last" if attempt else None)
    except SIGTERMException as stop:
        outcome["code"] = stop.code
        raise
    finally:
        outcome.update(
            rank=trainer.global_rank,
            pid=os.getpid(),
            batches=trainer.fit_loop.epoch_loop.batch_progress.total.completed,
            weights=weights(model),
        )
        (root / f"outcome_{attempt}_{trainer.global_rank}.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
