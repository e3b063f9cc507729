"""A correct training job with one rank slowed on purpose (``tests/helpers/slow_rank_tasks.py``), as a script.

Usage: ``python slow_rank_job.py OUT_DIR STRATEGY PLAN_JSON`` (STRATEGY: ``ddp``, ``model_parallel``, ``stock``,
``stock_model_parallel``); ``NUM_NODES`` set means torchrun started one process per rank. The world size is the plan's
``"devices"``, else ``DEVICES`` (2 by default). Every rank writes ``OUT_DIR/outcome_<rank>.json``. The hang checks keep
their real thresholds.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch.distributed as dist

from tests.helpers.slow_rank_tasks import fit


def main() -> None:
    out, strategy, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    nodes = int(os.environ.get("NUM_NODES", "1"))
    devices = plan.get("devices", int(os.environ.get("DEVICES", "2")))
    outcome = fit(out, plan, {"strategy": strategy}, devices // nodes, None, nodes)
    rank = dist.get_rank() if dist.is_initialized() else 0
    Path(out, f"outcome_{rank}.json").write_text(json.dumps(outcome))
    if dist.is_initialized():  # see README, "Noticed upstream": exit without it can SIGABRT (gloo)
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
