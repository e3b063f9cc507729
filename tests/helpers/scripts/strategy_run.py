"""The scenario of ``tests/strategy_scenarios.py`` as a script, for launchers that start one process per rank.

Usage: python strategy_run.py ROOT STRATEGY DEVICES NUM_NODES
STRATEGY is a registry name, or JSON for :func:`tests.helpers.strategy_scenarios.make_strategy`. Every rank writes its
outcome to ROOT/outcomes/rank_<r>.json.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch

from tests.helpers.strategy_scenarios import fit


def main() -> None:
    root, strategy, devices, num_nodes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    fit(root, json.loads(strategy) if strategy.startswith("{") else strategy, devices, num_nodes)
    if torch.distributed.is_initialized():  # see README, "Noticed upstream": exit without it can SIGABRT (gloo)
        torch.distributed.destroy_process_group()
    # Everything the tests read is written and closed by now; skip the interpreter's teardown of torch, which takes
    # seconds per process when 4 ranks share 2 cores.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
