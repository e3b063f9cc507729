"""Real runs of the strategies and launchers on CPU (gloo): ModelParallel (FSDP2) against DDP in a rank pool,
multi-node launches on loopback (torchrun, a simulated SLURM ``srun``), and Lightning's notebook launcher (fork) started
from an interactive interpreter. (``ddp_spawn_<policy>`` only sets ``start_method="spawn"``, which
tests/strategies/test_surface.py checks; tests/strategies/test_ddp.py::test_real_launch_* runs that start method.)

Every run plays the scenario of :mod:`tests.helpers.strategy_scenarios`; its expected outcomes were worked out by hand
there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_ext import read_rank_metrics
from tests.helpers.jobs import clean_env, free_port, launch
from tests.helpers.strategy_scenarios import EPOCHS_RUN, EXPECTED, PATH_KEYS, TABLE, checkpoint_listing

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "helpers" / "scripts" / "strategy_run.py"
POLICIES = {"checkpoint_policy": "mean", "early_stopping_policy": "majority", "per_rank_metrics": True}


# ---- checks shared by every run ------------------------------------------------------------------------------------
def check_outcomes(outcomes: list[dict[str, Any]], world: int, per_node: int, expected: dict[str, Any]) -> None:
    """Every rank ran as the launcher says and ended with the hand-worked outcome and the same paths."""
    assert [o["rank"] for o in outcomes] == list(range(world))
    assert [(o["node_rank"], o["local_rank"]) for o in outcomes] == [divmod(r, per_node) for r in range(world)]
    assert {o["world_size"] for o in outcomes} == {world}
    assert len({o["pid"] for o in outcomes}) == world
    for key in (*PATH_KEYS, "saves", "stopped_epoch", "should_stop"):
        values = [o[key] for o in outcomes]
        assert all(value == values[0] for value in values), f"ranks disagree on {key}: {values}"
    top_k = [name for name in outcomes[0]["saves"] if name != "last.ckpt"]
    assert top_k == expected["saves"]
    assert outcomes[0]["stopped_epoch"] == expected["stopped_epoch"]
    assert Path(outcomes[0]["best_model_path"]).name == expected["saves"][-1]
    assert Path(outcomes[0]["last_model_path"]).name == "last.ckpt"


def check_checkpoints(log_dir: str, expected: dict[str, Any], shards: int | None) -> dict[str, list[str] | None]:
    """The best and the last checkpoint exist under their agreed names: files, or one directory with every shard."""
    listing = checkpoint_listing(os.path.join(log_dir, "checkpoints"))
    assert sorted(listing) == sorted([expected["saves"][-1], "last.ckpt"])
    for contents in listing.values():
        if shards is None:
            assert contents is None
        else:
            assert contents is not None
            assert [name for name in contents if name.endswith(".distcp")] == [f"__{r}_0.distcp" for r in range(shards)]
    return listing


def check_rank_files(log_dir: str, world: int) -> None:
    """One agreed log directory holds every rank's own, un-synced values (the scripted table)."""
    table = read_rank_metrics(log_dir)
    assert sorted(table["rank"].unique()) == list(range(world))
    for rank in range(world):
        mine = table[table["rank"] == rank]
        assert mine["val_loss"].dropna().tolist() == TABLE[rank][:EPOCHS_RUN]
        assert mine["step_tag"].dropna().tolist() == [100.0 * rank + step for step in range(EPOCHS_RUN)]


def read_outcomes(root: Path, world: int) -> list[dict[str, Any]]:
    files = sorted((root / "outcomes").glob("rank_*.json"))
    assert len(files) == world, f"expected {world} outcome files, found {[f.name for f in files]}"
    return sorted((json.loads(f.read_text()) for f in files), key=lambda o: int(o["rank"]))


# ---- ModelParallel (FSDP2) against DDP, in a rank pool --------------------------------------------------------------
@pytest.mark.both_packages
def test_model_parallel_decides_saves_and_logs_as_ddp(rank_pools: Any, tmp_path: Path) -> None:
    """FSDP2 via ModelParallelStrategy: the same saves, stop, agreed paths and per-rank files as DDP; sharded dirs."""
    pool = rank_pools(2)
    expected = EXPECTED[(2, "mean", "majority")]
    specs = {
        "ddp": {"class": "ddp", **POLICIES},
        "model_parallel": {"class": "model_parallel", "data_parallel_size": 2, "tensor_parallel_size": 1, **POLICIES},
        "tuned_ddp": {"class": "tuned_ddp", **POLICIES},  # a user's own strategy with the mixin
    }
    runs = {
        name: pool.run("tests.helpers.strategy_scenarios:fit", (str(tmp_path / name), spec, 2), timeout=120)
        for name, spec in specs.items()
    }
    listings = {}
    for name, outcomes in runs.items():
        check_outcomes(outcomes, 2, 2, expected)
        log_dir = outcomes[0]["log_dir"]
        check_rank_files(log_dir, 2)
        listings[name] = check_checkpoints(log_dir, expected, shards=2 if name == "model_parallel" else None)
    assert runs["model_parallel"][0]["strategy"] == "PolicyModelParallelStrategy"
    assert runs["model_parallel"][0]["saves"] == runs["ddp"][0]["saves"]  # last.ckpt included
    assert sorted(listings["model_parallel"]) == sorted(listings["ddp"])
    for rank in range(2):
        relative = f"rank_{rank}/metrics.csv"
        files = {name: Path(runs[name][0]["log_dir"], relative).read_bytes() for name in runs}
        assert files["model_parallel"] == files["ddp"] == files["tuned_ddp"], relative

    # the policies matter here: stock ModelParallelStrategy stops at epoch 1 (any rank may stop everyone)
    stock = pool.run(
        "tests.helpers.strategy_scenarios:fit",
        (
            str(tmp_path / "stock"),
            {"class": "stock_model_parallel", "data_parallel_size": 2, "tensor_parallel_size": 1},
            2,
        ),
        timeout=120,
    )
    assert [o["stopped_epoch"] for o in stock] == [1, 1]


# ---- processes started by a launcher -------------------------------------------------------------------------------
@pytest.mark.parametrize("per_node", [1, 2], ids=["2x1", "2x2"])
def test_torchrun_two_nodes(tmp_path: Path, per_node: int) -> None:
    """Two ``torchrun`` agents, one per node (``--node-rank 0/1``), meeting on loopback."""
    world = 2 * per_node
    port = str(free_port())
    spec = json.dumps({"class": "ddp", **POLICIES})
    commands = {
        f"node{node}": (
            [
                *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node)),
                *("--nproc-per-node", str(per_node), "--master-addr", "127.0.0.1", "--master-port", port),
                *(str(SCRIPT), str(tmp_path), spec, str(per_node), "2"),
            ],
            clean_env(),
        )
        for node in (0, 1)
    }
    launch(commands, tmp_path)
    outcomes = read_outcomes(tmp_path, world)
    assert {o["strategy"] for o in outcomes} == {"PolicyDDPStrategy"}
    expected = EXPECTED[(world, "mean", "majority")]
    check_outcomes(outcomes, world, per_node, expected)
    check_checkpoints(outcomes[0]["log_dir"], expected, shards=None)
    check_rank_files(outcomes[0]["log_dir"], world)


def test_slurm_two_nodes_model_parallel(tmp_path: Path) -> None:
    """``srun --nodes 2 --ntasks-per-node 2``, simulated: a process per rank with SLURM's variables; FSDP2, 4 shards."""
    world, per_node = 4, 2
    spec = json.dumps({"class": "model_parallel", "data_parallel_size": world, "tensor_parallel_size": 1, **POLICIES})
    port = str(free_port())
    commands = {}
    for rank in range(world):
        env = clean_env(
            SLURM_JOB_NAME="policy-test",  # not "bash"/"interactive", which Lightning takes for an interactive shell
            SLURM_JOB_ID="4242",
            SLURM_NNODES="2",
            SLURM_NTASKS=str(world),
            SLURM_NTASKS_PER_NODE=str(per_node),
            SLURM_NODELIST="127.0.0.1",  # Lightning derives MASTER_ADDR from its first host
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank % per_node),
            SLURM_NODEID=str(rank // per_node),
            MASTER_PORT=port,
        )
        commands[f"rank{rank}"] = ([sys.executable, str(SCRIPT), str(tmp_path), spec, str(per_node), "2"], env)
    launch(commands, tmp_path)
    outcomes = read_outcomes(tmp_path, world)
    assert {o["strategy"] for o in outcomes} == {"PolicyModelParallelStrategy"}
    assert "SLURM auto-requeueing enabled" in (tmp_path / "rank0.log").read_text()  # Lightning took it for SLURM
    expected = EXPECTED[(world, "mean", "majority")]
    check_outcomes(outcomes, world, per_node, expected)
    check_checkpoints(outcomes[0]["log_dir"], expected, shards=world)
    check_rank_files(outcomes[0]["log_dir"], world)


NOTEBOOK_CELL = """
import json, os, sys
import lightning_ext  # before Lightning, as in a notebook's first cell
import lightning as L
from lightning.fabric.utilities.imports import _IS_INTERACTIVE
from lightning.pytorch.strategies import StrategyRegistry

registered = sorted(name for name in StrategyRegistry if name.endswith("_majority"))
refused = {}
for name in ("ddp", "ddp_majority", "ddp_spawn", "ddp_spawn_majority"):
    try:
        L.Trainer(strategy=name, accelerator="cpu", devices=2)
    except Exception as error:
        refused[name] = str(error).replace(repr(name), "<name>")
cell = {"interactive": _IS_INTERACTIVE, "pid": os.getpid(), "registered": registered, "refused": refused}
print("CELL " + json.dumps(cell), flush=True)

from tests.helpers.jobs import LAUNCH_TIMEOUT, clean_env, free_port, launch
from tests.helpers.strategy_scenarios import fit
fit(sys.argv[1], "ddp_notebook_majority", 2)
"""


def test_notebook_launcher_from_an_interactive_interpreter(tmp_path: Path) -> None:
    """``python -i`` stands in for a notebook kernel: Lightning sees an interactive session and forks the ranks."""
    command = [sys.executable, "-i", "-c", NOTEBOOK_CELL, str(tmp_path)]
    process = subprocess.run(
        command, cwd=tmp_path, env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180
    )
    output = f"{process.stdout}\n{process.stderr}"
    assert process.returncode == 0, output
    cell = json.loads(next(line for line in process.stdout.splitlines() if line.startswith("CELL "))[5:])
    assert cell["interactive"] is True
    families = ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "fsdp", "deepspeed")
    assert cell["registered"] == sorted(f"{family}_majority" for family in families)  # by the import hook
    # our popen and spawn names are refused in a notebook exactly as Lightning's own are
    assert cell["refused"]["ddp_majority"] == cell["refused"]["ddp"], output
    assert cell["refused"]["ddp_spawn_majority"] == cell["refused"]["ddp_spawn"], output
    assert "not compatible with an interactive environment" in cell["refused"]["ddp"]
    outcomes = read_outcomes(tmp_path, 2)
    assert cell["pid"] not in {o["pid"] for o in outcomes}  # the ranks are forked children of the kernel
    check_outcomes(outcomes, 2, 2, EXPECTED[(2, "majority", "majority")])
