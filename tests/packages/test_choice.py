"""Which Lightning package ``lightning_ext.X`` is for, the explicit choice, the names in both registries, and the error
for a run that mixes the two packages.

Every expectation below is the documented rule (docs/pytorch-lightning.md), written out by hand: the module's own
imports decide; else the one package imported; else ``lightning``, unless only ``pytorch_lightning`` is installed.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import pytest
import pytorch_lightning as pl

import lightning_ext
import lightning_ext.lightning
import lightning_ext.pytorch_lightning
from lightning_ext._packages.choice import choose
from lightning_ext.errors import LightningPackageMismatchError

REPO = Path(__file__).resolve().parents[2]
BOUND = ["PolicyDDPStrategy", "PolicyFSDPStrategy", "PolicyModelParallelStrategy", "PolicyStrategyMixin"]


def whose(cls: type) -> str:
    """The Lightning package in ``cls``'s bases, read from the bases' modules (not from lightning-ext)."""
    roots = {base.__module__.split(".")[0] for base in cls.__mro__} & {"lightning", "pytorch_lightning"}
    (root,) = roots
    return root


# ---- the rule --------------------------------------------------------------------------------------------------------
L_, PL = "lightning", "pytorch_lightning"


@pytest.mark.parametrize(
    ("own", "loaded", "installed", "expected"),
    [
        ({PL}, {L_}, True, PL),  # the module's own imports first, whatever else is loaded
        ({L_}, {PL}, True, L_),
        ({PL}, set(), True, PL),
        (set(), {PL}, True, PL),  # else the one package imported (LightningCLI's YAML, python -c)
        (set(), {L_}, False, L_),
        ({L_, PL}, {PL}, True, PL),  # a module that imports both does not decide
        (set(), {L_, PL}, True, L_),  # both imported: the default
        (set(), set(), True, L_),  # neither yet, lightning installed: the default
        (set(), set(), False, PL),  # neither yet, only pytorch_lightning installed
    ],
)
def test_the_rule(own: set[str], loaded: set[str], installed: bool, expected: str) -> None:
    assert choose(frozenset(own), frozenset(loaded), installed) == expected  # type: ignore[arg-type]


# ---- the rule in a process that has imported both packages: only the module's own imports can say pytorch_lightning
NAMES = "from lightning_ext import PolicyDDPStrategy, PolicyStrategyMixin\n"  # as users write it
MODULES = {
    "isort_order": NAMES + "from pytorch_lightning import Trainer\n",  # isort puts lightning_ext's import first
    "straight_import": "import pytorch_lightning as pl\n" + NAMES,
    "star": "from lightning_ext import *\nfrom pytorch_lightning.callbacks import ModelCheckpoint\n",
    "lazy": "import lightning_ext\nimport pytorch_lightning\n\n\ndef strategy():\n"
    + "    return lightning_ext.PolicyDDPStrategy\n",  # read in a function, at call time
    "uses_lightning": "import lightning as L\n" + NAMES,
    "uses_neither": NAMES,
    "uses_both": "import lightning\nimport pytorch_lightning\n" + NAMES,
}
EXPECTED = {
    "isort_order": PL,
    "straight_import": PL,
    "star": PL,
    "lazy": PL,
    "uses_lightning": L_,
    "uses_neither": L_,
    "uses_both": L_,
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_gets_the_strategies_of_the_package_it_imports(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = f"choice_{name}"
    (tmp_path / f"{package}.py").write_text(MODULES[name])
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(package)
    strategy = module.strategy() if name == "lazy" else module.PolicyDDPStrategy
    assert whose(strategy) == EXPECTED[name]
    explicit = lightning_ext.pytorch_lightning if EXPECTED[name] == PL else lightning_ext.lightning
    assert strategy is explicit.PolicyDDPStrategy
    if hasattr(module, "PolicyStrategyMixin"):
        assert module.PolicyStrategyMixin is explicit.PolicyStrategyMixin


def test_the_explicit_modules_give_one_package_and_share_everything_else() -> None:
    for explicit, package in ((lightning_ext.pytorch_lightning, PL), (lightning_ext.lightning, L_)):
        assert explicit.__all__ == lightning_ext.__all__
        for name in BOUND[:-1]:
            assert whose(getattr(explicit, name)) == package, name
        mixin = explicit.PolicyStrategyMixin  # no Lightning base of its own: the module it was compiled as says
        assert mixin.__module__.startswith("lightning_ext.pytorch_lightning." if package == PL else "lightning_ext.str")
        for name in set(lightning_ext.__all__) - {*BOUND, "PolicyDeepSpeedStrategy"}:
            assert getattr(explicit, name) is getattr(lightning_ext, name), name  # one Quorum, one CrossRankError
        with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
            explicit.Nothing  # noqa: B018
    # the pure modules are one module: an error of either package's run is caught as lightning_ext's
    assert lightning_ext.pytorch_lightning.CrossRankError is lightning_ext.CrossRankError


# ---- the names, in both registries -----------------------------------------------------------------------------------
def test_the_names_build_each_packages_own_strategy() -> None:
    for trainer_class, package in ((pl.Trainer, PL), (L.Trainer, L_)):
        trainer = trainer_class(strategy="ddp_notebook_majority", accelerator="cpu", devices=2, logger=False)
        assert whose(type(trainer.strategy)) == package and trainer.strategy._start_method == "fork"
        assert trainer.strategy.checkpoint_policy == lightning_ext.Majority()
        with pytest.raises(ValueError, match="requires a GPU accelerator"):  # as Lightning refuses "fsdp" on CPU
            trainer_class(strategy="fsdp_mean", accelerator="cpu", devices=2)
    for name in ("ddp_mean", "ddp_spawn_any", "ddp_fork_policy", "fsdp_rank_zero", "deepspeed_majority"):
        assert name in pl.strategies.StrategyRegistry and name in L.strategies.StrategyRegistry, name


_STANDALONE = """
import json, sys, warnings
sys.modules["lightning"] = None  # as if only pytorch-lightning were installed: importing lightning fails
warnings.simplefilter("error", RuntimeWarning)  # a failed registration warns: make it fail here
import lightning_ext
first = lightning_ext.PolicyDDPStrategy  # neither package imported yet: only pytorch_lightning is installed
import pytorch_lightning as pl
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.demos.boring_classes import BoringDataModule, BoringModel
config = sys.argv[1]
strategy = LightningCLI(BoringModel, BoringDataModule, run=False, args=["--config", config]).trainer.strategy
named = pl.Trainer(strategy="ddp_majority", accelerator="cpu", devices=2, logger=False).strategy
print("RESULT " + json.dumps({
    "first": first.__module__,
    "cli": [type(strategy).__module__, repr(strategy.checkpoint_policy), repr(strategy.early_stopping_policy)],
    "named": [type(named).__module__, repr(named.checkpoint_policy)],
    "lightning": sorted(m for m in sys.modules if m.split(".")[0] == "lightning" and sys.modules[m] is not None),
}))
"""


def test_a_pytorch_lightning_only_process_gets_its_classes_its_names_and_its_cli(tmp_path: Path) -> None:
    """A fresh interpreter where ``lightning`` cannot be imported, with ``pytorch_lightning.cli.LightningCLI``."""
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
                  checkpoint_policy: mean
                  early_stopping_policy:
                    class_path: lightning_ext.Quorum
                    init_args: {k: 2}
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    run = subprocess.run(
        [sys.executable, "-c", _STANDALONE, str(config)], capture_output=True, text=True, timeout=180, env=env
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    module = "lightning_ext.pytorch_lightning.strategies.ddp"
    assert result == {
        "first": module,
        "cli": [module, "AggregatePolicy('mean')", "Quorum(k=2)"],
        "named": [module, "Majority()"],
        "lightning": [],
    }


def test_lightning_cli_of_pytorch_lightning_in_a_process_with_both_packages(tmp_path: Path) -> None:
    """Both imported, ``lightning_ext.X`` in YAML is ``lightning``'s: the explicit path picks ``pytorch_lightning``."""
    from pytorch_lightning.cli import LightningCLI
    from pytorch_lightning.demos.boring_classes import BoringDataModule, BoringModel

    config = tmp_path / "config.yaml"
    config.write_text(
        "trainer:\n  accelerator: cpu\n  devices: 2\n  logger: false\n  strategy:\n"
        "    class_path: lightning_ext.pytorch_lightning.PolicyModelParallelStrategy\n"
        "    init_args: {data_parallel_size: 2, tensor_parallel_size: 1, checkpoint_policy: rank_zero}\n"
    )
    strategy = LightningCLI(BoringModel, BoringDataModule, run=False, args=["--config", str(config)]).trainer.strategy
    assert whose(type(strategy)) == PL and type(strategy).__name__ == "PolicyModelParallelStrategy"
    assert strategy.checkpoint_policy == lightning_ext.RankZero()


# ---- mixing the packages: one error that names both, and the fix -----------------------------------------------------
def test_a_strategy_of_the_other_package_is_named_by_the_trainer() -> None:
    for trainer_class, ours, theirs in ((pl.Trainer, PL, L_), (L.Trainer, L_, PL)):
        other = getattr(lightning_ext, theirs).PolicyDDPStrategy(checkpoint_policy="mean")
        with pytest.raises(LightningPackageMismatchError) as caught:
            trainer_class(strategy=other, accelerator="cpu", devices=2, logger=False)
        message = str(caught.value)
        assert f"PolicyDDPStrategy is lightning-ext's strategy for {theirs}, but this Trainer is {ours}'s" in message
        assert f"`from lightning_ext.{ours} import PolicyDDPStrategy`" in message
    # a stock strategy of the other package keeps Lightning's own error: stock behaviour is not ours to change
    with pytest.raises(ValueError, match="You selected an invalid strategy name"):
        pl.Trainer(strategy=L.strategies.DDPStrategy(), accelerator="cpu", devices=2)


def test_a_user_strategy_built_on_both_packages_is_refused_where_it_is_defined() -> None:
    with pytest.raises(LightningPackageMismatchError) as caught:

        class MyStrategy(lightning_ext.lightning.PolicyStrategyMixin, pl.strategies.DDPStrategy):  # type: ignore[misc]
            pass

    message = str(caught.value)
    assert (
        "MyStrategy is lightning-ext's strategy for lightning, but MyStrategy's base strategy is pytorch_lightning's"
        in (message)
    )
    assert "`from lightning_ext.pytorch_lightning import PolicyStrategyMixin`" in message


@pytest.mark.parametrize(
    ("what", "named", "fix"),
    [
        (
            "callback",
            "the callback ModelCheckpoint is lightning's (lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
            "use pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint",
        ),
        (
            "logger",
            "the logger CSVLogger is lightning's (lightning.pytorch.loggers.csv_logs.CSVLogger)",
            "use pytorch_lightning.loggers.csv_logs.CSVLogger",
        ),
    ],
)
def test_a_lightning_object_in_a_pytorch_lightning_run_is_one_error_on_every_rank(
    rank_pools: Any, tmp_path: Path, what: str, named: str, fix: str
) -> None:
    """Stock Lightning 2.6 runs it silently: the callback outside the seams, decided by each rank alone."""
    messages = rank_pools(2).run("tests.helpers.package_tasks:fit_with_lightning_object", (str(tmp_path), what))
    assert len(set(messages)) == 1, messages
    (message,) = set(messages)
    if what == "callback" and pl.__version__.startswith("2.5."):  # 2.5 refuses a stateful one itself, on Trainer(...)
        stock = "You passed a `lightning.pytorch` object (ModelCheckpoint) to a `pytorch_lightning` Trainer."
        assert message.startswith(f"TypeError: {stock}"), message
        return
    assert message.startswith("LightningPackageMismatchError: This run mixes Lightning's two packages: the Trainer and")
    assert named in message and fix in message
