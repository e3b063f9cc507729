"""The demo's second part: two pitfalls that freeze stock DDP, each ending in one error on every rank."""

import json
import os
import shutil
import signal
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
    # Lightning's banners stay out of the demo's output; they are shown if the launch itself fails. A session of its
    # own: the ranks Lightning's launcher starts are the run's children, and a run past its time ends with all of them
    run = subprocess.Popen(
        command,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        stdout, stderr = run.communicate()
        raise RuntimeError(
            f"The {pitfall} run did not end within {timeout:.0f} s, so its {devices} ranks were stopped; it takes "
            f"seconds on an idle machine, so run the demo again when this one is less busy. Its output:\n"
            f"{stdout}{stderr}"
        ) from None
    if run.returncode != 0:
        raise RuntimeError(f"the {pitfall} run failed (exit {run.returncode}):\n{stdout}{stderr}")
    outcomes = []
    for rank in range(devices):
        with open(os.path.join(out_dir, f"rank_{rank}.json"), encoding="utf-8") as file:
            outcomes.append(json.load(file))
    return outcomes
