"""The demo's second part: two pitfalls that freeze stock DDP, each ending in one error on every rank."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["PITFALLS", "run_pitfall"]

PITFALLS = {
    "uneven_batches": "rank 1 reads 2 more batches than rank 0 (use_distributed_sampler=False)",
    "log_on_rank_zero": "self.log('val_acc', ..., sync_dist=True) under `if self.trainer.is_global_zero:`",
}
# set by the outer demo's launch; a child that saw them would think it was one of the outer run's ranks
_LAUNCH_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GLOBAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RANK")


def run_pitfall(pitfall: str, devices: int, out_dir: str, timeout: float = 180.0) -> list[dict[str, Any]]:
    """Train with ``pitfall`` on ``devices`` CPU ranks in a fresh launch; each rank's outcome, rank order."""
    os.makedirs(out_dir, exist_ok=True)
    environment = {key: value for key, value in os.environ.items() if key not in _LAUNCH_VARIABLES}
    script = shutil.copy(Path(__file__).with_name("pitfall_model.py"), os.path.join(out_dir, "pitfall_model.py"))
    command = [sys.executable, script, pitfall, out_dir, "--devices", str(devices)]
    # Lightning's banners stay out of the demo's output; they are shown if the launch itself fails
    done = subprocess.run(command, env=environment, timeout=timeout, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {pitfall} run failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    outcomes = []
    for rank in range(devices):
        with open(os.path.join(out_dir, f"rank_{rank}.json"), encoding="utf-8") as file:
            outcomes.append(json.load(file))
    return outcomes
