"""The strategy's surface: DDPStrategy's arguments, the registry, LightningCLI, real launches, the seams."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

import lightning_ext
from lightning_ext import AggregatePolicy, AllRanks, AnyRank, PolicyDDPStrategy, Quorum, read_rank_metrics
from lightning_ext.policies import resolve_policy
from lightning_ext.strategies._runtime import patch_mode

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.both_packages
def test_ddp_arguments_are_passed_through_to_ddp_strategy() -> None:
    strategy = PolicyDDPStrategy(start_method="spawn", find_unused_parameters=True, process_group_backend="gloo")
    assert strategy._start_method == "spawn"
    assert strategy._ddp_kwargs == {"find_unused_parameters": True}
    assert strategy._process_group_backend == "gloo"
    assert isinstance(strategy, DDPStrategy)


@pytest.mark.both_packages
def test_default_policies_are_the_stock_all_and_any() -> None:
    strategy = PolicyDDPStrategy()
    assert strategy.checkpoint_policy == AllRanks() and strategy.early_stopping_policy == AnyRank()


@pytest.mark.both_packages
def test_unknown_policy_name_is_rejected_with_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"Unknown decision policy 'avg'\. Valid names: 'all', 'any'"):
        PolicyDDPStrategy(checkpoint_policy="avg")


@pytest.mark.parametrize(
    "name", ["all", "any", pytest.param("majority", marks=pytest.mark.both_packages), "rank_zero", "mean", "min", "max"]
)
def test_each_registry_name_builds_the_strategy_with_that_policy(name: str) -> None:
    assert f"ddp_{name}" in StrategyRegistry
    trainer = L.Trainer(strategy=f"ddp_{name}", accelerator="cpu", devices=2, logger=False)
    assert isinstance(trainer.strategy, PolicyDDPStrategy)
    assert trainer.strategy.checkpoint_policy == trainer.strategy.early_stopping_policy == resolve_policy(name)


@pytest.mark.both_packages
def test_registry_name_ddp_policy_keeps_the_stock_rules() -> None:
    trainer = L.Trainer(strategy="ddp_policy", accelerator="cpu", devices=2, logger=False)
    assert trainer.strategy.checkpoint_policy == AllRanks()
    assert trainer.strategy.early_stopping_policy == AnyRank()


def test_lightning_cli_yaml_config_builds_the_strategy_with_its_policies(tmp_path: Path) -> None:
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    config = tmp_path / "config.yaml"
    config.write_text(
        textwrap.dedent(
            """
            trainer:
              accelerator: cpu
              devices: 2
              logger: false
              strategy:
                class_path: lightning_ext.PolicyDDPStrategy
                init_args:
                  start_method: spawn
                  checkpoint_policy: mean
                  early_stopping_policy:
                    class_path: lightning_ext.Quorum
                    init_args:
                      k: 2
            """
        )
    )
    cli = LightningCLI(BoringModel, BoringDataModule, run=False, args=["--config", str(config)])
    strategy = cli.trainer.strategy
    assert isinstance(strategy, PolicyDDPStrategy)
    assert strategy.checkpoint_policy == AggregatePolicy("mean")
    assert strategy.early_stopping_policy == Quorum(2)
    assert strategy._start_method == "spawn"


@pytest.mark.slow
@pytest.mark.parametrize(("start_method", "devices"), [("popen", 2), ("spawn", 3)])
def test_real_launch_agrees_on_the_mean_checkpoint_and_writes_every_rank_file(
    tmp_path: Path, start_method: str, devices: int
) -> None:
    """A user's script, launched by Lightning itself (subprocess re-launch or torch.multiprocessing spawn)."""
    out = tmp_path / "ranks.jsonl"
    script = REPO / "tests" / "helpers" / "scripts" / "launch.py"
    process = subprocess.run(
        [sys.executable, str(script), str(out), start_method, str(devices), "mean"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert process.returncode == 0, f"launch failed (every rank's output below):\n{process.stdout}\n{process.stderr}"
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["rank"] for r in records) == list(range(devices))
    assert len({r["pid"] for r in records}) == devices
    # mean of the table's ranks: e0 4.0; e1 4.0 (2 ranks) or 4.33 (3): no save; e2 4.0/4.17: no; e3 2.5/3.67: save
    best = {2: "epoch=3-val_loss=2.50.ckpt", 3: "epoch=3-val_loss=3.67.ckpt"}[devices]
    assert {r["best"] for r in records} == {best}
    log_dirs = {r["log_dir"] for r in records}
    assert len(log_dirs) == 1  # one version directory, decided once
    log_dir = Path(log_dirs.pop())
    assert (log_dir / "checkpoints" / best).exists()
    # per-rank metrics under a real launcher: every rank's own value, in every rank's own file
    table = read_rank_metrics(log_dir)
    seen = table.dropna(subset=["rank_seen"]).groupby("rank")["rank_seen"].unique()
    assert {rank: list(values) for rank, values in seen.items()} == {rank: [float(rank)] for rank in range(devices)}


@pytest.mark.both_packages
def test_runtime_seams_are_installed_on_lightning_call_sites() -> None:
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    assert patch_mode() == "runtime"
    assert getattr(ModelCheckpoint._save_topk_checkpoint, "__lightning_ext_seam__", False)
    assert getattr(EarlyStopping._run_early_stopping_check, "__lightning_ext_seam__", False)
    assert lightning_ext.strategies._runtime.seams_available()


def test_runtime_patching_switched_off_on_an_unpatched_lightning_is_a_clear_error() -> None:
    code = "import lightning_ext; lightning_ext.PolicyDDPStrategy()"
    process = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LIGHTNING_EXT_RUNTIME_PATCHING": "0"},
    )
    assert process.returncode != 0
    assert "not patched and runtime patching is switched off" in process.stderr
    assert "python -m lightning_ext.patches apply" in process.stderr
