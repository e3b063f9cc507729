"""The mirror: a package's Lightning-bound modules compiled again for ``pytorch_lightning``, the others shared.

A small package written here (``toy``) holds one module of each kind; what must be compiled again and what must be
shared is listed by hand. Then lightning-ext's own modules, loaded for ``pytorch_lightning``.
"""

from __future__ import annotations

import importlib
import pickle
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch
import pytest
import pytorch_lightning

import lightning_ext.pytorch_lightning
from lightning_ext._packages.mirror import LIGHTNING_EXT, Mirror
from tests.helpers.packages import lightning_objects

TOY = {
    "__init__.py": "",
    "pure.py": "class Shared:\n    pass\n",
    "bound.py": (
        "from lightning.pytorch.callbacks import ModelCheckpoint\n"
        "from mirror_toy import pure\n"
        "from mirror_toy.pure import Shared\n"
        "\n"
        "def fail():\n"
        "    raise ValueError('from line 6')\n"
    ),
    "through.py": "from mirror_toy import bound\n",  # Lightning through another module
    "lazy.py": "def rank_zero():\n    from lightning.fabric.utilities import rank_zero\n    return rank_zero\n",
    "typing_only.py": "import typing\nif typing.TYPE_CHECKING:\n    from lightning.pytorch import Trainer\n",
    "relative.py": "from .bound import ModelCheckpoint\n",
    "top.py": "import lightning\nimport mirror_toy\n",
    "sub/__init__.py": "",
    "sub/child.py": "from lightning.pytorch.strategies import DDPStrategy\n",
    "dotted.py": "import lightning.pytorch\n",  # binds `lightning`: no faithful rename
    "other.py": "from lightning.data import StreamingDataset\n",  # no pytorch_lightning counterpart
}
COMPILED_AGAIN = {
    f"mirror_toy.{name}" for name in ("bound", "through", "lazy", "relative", "top", "sub.child", "dotted", "other")
}
SHARED = {"mirror_toy.pure", "mirror_toy.typing_only"}


@pytest.fixture
def toy(tmp_path: Path) -> Iterator[Mirror]:
    for name, text in {**TOY, "mirror_toy_pl/__init__.py": ""}.items():
        path = tmp_path / (name if name.startswith("mirror_toy_pl") else f"mirror_toy/{name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    sys.path.insert(0, str(tmp_path))
    mirror = Mirror("mirror_toy", "mirror_toy_pl")
    mirror.install()
    yield mirror
    sys.meta_path.remove(mirror)
    sys.path.remove(str(tmp_path))
    for name in [name for name in sys.modules if name.split(".")[0] in ("mirror_toy", "mirror_toy_pl")]:
        del sys.modules[name]


def test_what_imports_lightning_is_compiled_again_and_the_rest_is_shared(toy: Mirror) -> None:
    assert toy.bound == COMPILED_AGAIN
    import mirror_toy.bound
    import mirror_toy.pure

    mirrored = importlib.import_module("mirror_toy_pl.bound")
    assert mirrored is not mirror_toy.bound and mirrored.__name__ == "mirror_toy_pl.bound"
    assert mirrored.ModelCheckpoint is pytorch_lightning.callbacks.ModelCheckpoint
    assert mirror_toy.bound.ModelCheckpoint is lightning.pytorch.callbacks.ModelCheckpoint  # the original: untouched
    for name in SHARED:  # one module, its classes shared by both packages
        assert importlib.import_module(name.replace("mirror_toy", "mirror_toy_pl")) is importlib.import_module(name)
    assert mirrored.Shared is mirror_toy.pure.Shared and mirrored.pure is mirror_toy.pure
    assert importlib.import_module("mirror_toy_pl.through").bound is mirrored
    assert (
        importlib.import_module("mirror_toy_pl.relative").ModelCheckpoint is pytorch_lightning.callbacks.ModelCheckpoint
    )
    assert importlib.import_module("mirror_toy_pl.lazy").rank_zero().__name__ == "lightning_fabric.utilities.rank_zero"
    top = importlib.import_module("mirror_toy_pl.top")
    assert top.lightning is pytorch_lightning and top.mirror_toy is importlib.import_module("mirror_toy_pl")
    child = importlib.import_module("mirror_toy_pl.sub.child")
    assert child.DDPStrategy is pytorch_lightning.strategies.DDPStrategy
    assert "child" not in vars(importlib.import_module("mirror_toy.sub"))  # the original package keeps its own children


def test_a_compiled_module_keeps_its_file_and_line_numbers(toy: Mirror) -> None:
    with pytest.raises(ValueError, match="from line 6") as raised:
        importlib.import_module("mirror_toy_pl.bound").fail()
    last = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert (Path(last.filename), last.lineno, last.line) == (
        toy._root / "bound.py",
        6,
        "raise ValueError('from line 6')",
    )


@pytest.mark.parametrize(
    ("module", "problem"),
    [
        ("dotted", "dotted.py:1: `import lightning.pytorch` cannot be renamed; add `as ...`"),
        ("other", "other.py:1: lightning.data has no counterpart in pytorch_lightning"),
    ],
)
def test_an_import_without_a_faithful_rename_is_refused_naming_the_line(toy: Mirror, module: str, problem: str) -> None:
    with pytest.raises(ImportError) as raised:
        importlib.import_module(f"mirror_toy_pl.{module}")
    assert str(raised.value).endswith(problem)


def test_renamed_is_lightnings_own_renaming() -> None:
    assert [
        LIGHTNING_EXT.renamed(name)
        for name in (
            "lightning",
            "lightning.pytorch",
            "lightning.pytorch.callbacks.model_checkpoint",
            "lightning.fabric.utilities",
            "lightning_ext",
            "lightning_ext.strategies.ddp",
            "lightning_ext.pytorch_lightning.strategies",
            "lightning_utilities.core",
            "torch.distributed",
        )
    ] == [
        "pytorch_lightning",
        "pytorch_lightning",
        "pytorch_lightning.callbacks.model_checkpoint",
        "lightning_fabric.utilities",
        "lightning_ext.pytorch_lightning",
        "lightning_ext.pytorch_lightning.strategies.ddp",
        "lightning_ext.pytorch_lightning.strategies",
        "lightning_utilities.core",
        "torch.distributed",
    ]


def test_lightning_ext_shares_its_errors_policies_and_files_and_compiles_its_seams_again() -> None:
    bound = LIGHTNING_EXT.bound
    seams = {
        *(f"lightning_ext.strategies.{name}" for name in ("ddp", "fsdp", "model_parallel", "mixin", "_runtime")),
        "lightning_ext.strategies._compat",
        "lightning_ext._decisions.checkpoint",
        "lightning_ext._decisions.early_stopping",
        "lightning_ext._checks.guard",
        "lightning_ext._checks.hooks",
        "lightning_ext._per_rank.local_values",
        "lightning_ext._per_rank.logger",
    }
    assert seams <= bound
    shared = {
        "lightning_ext.errors",  # one CrossRankError for both packages' runs
        "lightning_ext.policies",  # one Quorum
        "lightning_ext.rank_metrics",
        "lightning_ext._per_rank.writer",  # one PerRankMetrics
        "lightning_ext._collective",  # one process group for the checks
        "lightning_ext.strategies._registry",
    }
    assert not shared & bound
    for name in shared:
        assert importlib.import_module(LIGHTNING_EXT.renamed(name)) is importlib.import_module(name)


def test_every_module_of_the_subsystems_loads_for_pytorch_lightning_and_holds_nothing_of_lightning() -> None:
    prefixes = (
        "lightning_ext.strategies",
        "lightning_ext._decisions",
        "lightning_ext._checks",
        "lightning_ext._preemption",
        "lightning_ext._per_rank",
        "lightning_ext._telemetry",
    )
    loaded = [
        importlib.import_module(LIGHTNING_EXT.renamed(name))
        for name in LIGHTNING_EXT.bound
        if name.startswith(prefixes)
    ]
    assert len(loaded) >= 14
    assert lightning_objects() == []


def test_a_strategy_for_pytorch_lightning_pickles_by_its_mirror_name() -> None:
    """A spawned rank unpickles it: importing its module name installs the mirror first."""
    strategy = lightning_ext.pytorch_lightning.PolicyDDPStrategy(checkpoint_policy="mean")
    copy = pickle.loads(pickle.dumps(strategy))
    assert type(copy) is type(strategy) and type(copy).__module__ == "lightning_ext.pytorch_lightning.strategies.ddp"
    assert copy.checkpoint_policy == strategy.checkpoint_policy
