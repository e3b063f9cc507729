"""Which Lightning package a module uses, whose a class is, and the error for a run that mixes the two."""

import ast
import importlib
import importlib.util
import linecache
import sys
from collections.abc import Iterable
from functools import cache
from types import FrameType
from typing import Any, Literal

from lightning_ext.errors import LightningPackageMismatchError

__all__ = [
    "BOUND_NAMES",
    "DISTRIBUTIONS",
    "MIRROR",
    "RENAMES",
    "TRIGGERS",
    "Package",
    "check_one_package",
    "choose",
    "module_for",
    "package_for_caller",
    "package_of",
    "parts_of_run",
    "strategy_for_other_package",
]

Package = Literal["lightning", "pytorch_lightning"]

TRIGGERS: dict[Package, str] = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}
"""The module whose import means that a package is in use."""

DISTRIBUTIONS: dict[Package, str] = {"lightning": "lightning", "pytorch_lightning": "pytorch-lightning"}
"""What ``pip install`` calls each package."""

RENAMES = (("lightning.pytorch", "pytorch_lightning"), ("lightning.fabric", "lightning_fabric"))
"""How Lightning names the modules of its standalone packages, and so how lightning-ext's are renamed for them."""

MIRROR = "lightning_ext.pytorch_lightning"
"""Where lightning-ext's modules for ``pytorch_lightning`` live: ``lightning_ext.X`` becomes ``<MIRROR>.X``."""

BOUND_NAMES = frozenset(
    {
        "PolicyDDPStrategy",
        "PolicyDeepSpeedStrategy",
        "PolicyFSDPStrategy",
        "PolicyModelParallelStrategy",
        "PolicyStrategyMixin",
    }
)
"""The public names that are one class per package; every other public name is one object for both."""

_ROOTS: dict[str, Package] = {
    "lightning": "lightning",
    "pytorch_lightning": "pytorch_lightning",
    "lightning_fabric": "pytorch_lightning",
}
_IMPORT_MACHINERY = ("<frozen importlib", importlib.__file__)


def module_for(module: str, package: Package) -> str:
    """The name of lightning-ext's ``module`` for ``package``.

    Example:
        >>> module_for("lightning_ext.strategies.ddp", "pytorch_lightning")
        'lightning_ext.pytorch_lightning.strategies.ddp'
        >>> module_for("lightning_ext.strategies.ddp", "lightning")
        'lightning_ext.strategies.ddp'

    """
    return module if package == "lightning" else MIRROR + module.removeprefix("lightning_ext")


def choose(own: frozenset[Package], loaded: frozenset[Package], lightning_installed: bool) -> Package:
    """The package for a module that imports ``own``, in a process that has imported ``loaded``.

    The module's own imports decide; else the one package imported; else ``lightning``, unless only
    ``pytorch_lightning`` is installed.

    Example:
        >>> choose(frozenset({"pytorch_lightning"}), frozenset({"lightning"}), True)
        'pytorch_lightning'
        >>> choose(frozenset(), frozenset({"pytorch_lightning"}), True)
        'pytorch_lightning'
        >>> choose(frozenset({"lightning", "pytorch_lightning"}), frozenset({"lightning", "pytorch_lightning"}), True)
        'lightning'
        >>> choose(frozenset(), frozenset(), False)
        'pytorch_lightning'

    """
    for candidates in (own, loaded):
        if len(candidates) == 1:
            return next(iter(candidates))
    return "lightning" if loaded or lightning_installed else "pytorch_lightning"


def package_for_caller(frame: FrameType | None) -> Package:
    """:func:`choose` for the module that runs ``frame`` (frames of the import machinery are skipped)."""
    while frame is not None and frame.f_code.co_filename.startswith(_IMPORT_MACHINERY):
        frame = frame.f_back
    own = frozenset() if frame is None else _imported_by(frame.f_code.co_filename)
    loaded = frozenset(package for package, trigger in TRIGGERS.items() if trigger in sys.modules)
    return choose(own, loaded, lightning_installed=bool(loaded) or _installed("lightning"))


def package_of(cls: type) -> Package | None:
    """Whose class ``cls`` is: the package of the first Lightning class in its MRO, or ``None``.

    Example:
        >>> package_of(int) is None
        True

    """
    lightning = _first_lightning_class(cls)
    return None if lightning is None else _ROOTS[lightning.__module__.partition(".")[0]]


def parts_of_run(strategy: Any, trainer: Any) -> list[tuple[str, object]]:
    """Every Lightning object of a run, as ``(what it is, the object)``: the strategy's plugins, and with a trainer,
    the trainer, the module, the datamodule, the callbacks and the loggers."""
    parts: list[tuple[str, object]] = [("the accelerator", strategy.accelerator)]
    parts += [("the precision plugin", strategy.precision_plugin)]
    parts += [("the cluster environment", strategy.cluster_environment), ("the checkpoint IO", strategy._checkpoint_io)]
    if trainer is not None:
        parts += [("the Trainer", trainer), ("the LightningModule", trainer.lightning_module)]
        parts += [("the datamodule", trainer.datamodule)] if trainer.datamodule is not None else []
        parts += [(f"the callback {type(callback).__name__}", callback) for callback in trainer.callbacks]
        parts += [(f"the logger {type(logger).__name__}", logger) for logger in trainer.loggers]
    return parts


def check_one_package(package: Package, objects: Iterable[tuple[str, object]], strategy: str) -> None:
    """Raise if one of ``objects`` (``(what it is, the object)``) belongs to the other package than ``package``.

    Raises:
        LightningPackageMismatchError: naming the object, its Lightning class, both packages and the fix.

    """
    for what, value in objects:
        found = _first_lightning_class(type(value))
        if found is None or _ROOTS[found.__module__.partition(".")[0]] == package:
            continue
        other = _ROOTS[found.__module__.partition(".")[0]]
        kind = _qualified(found) if found is type(value) else f"a subclass of {_qualified(found)}"
        raise LightningPackageMismatchError(
            f"This run mixes Lightning's two packages: the Trainer and {strategy} are {package}'s, but {what} is"
            f" {other}'s ({kind}). They are separate class hierarchies: {package}'s Trainer does not treat it as its"
            f" own, and lightning-ext's seams do not reach it. Import every Lightning class from {package}: use"
            f" {_counterpart(found, package)}."
        )


def strategy_for_other_package(strategy: type, theirs: Package, mine: Package, where: str) -> TypeError:
    """The error for ``strategy``, lightning-ext's for ``theirs``, where ``where`` (a Trainer, a base) is ``mine``'s."""
    ours = strategy.__module__.startswith("lightning_ext.")
    name = strategy.__name__ if ours else "PolicyStrategyMixin"
    fix = f"`from lightning_ext.{mine} import {name}`"
    if not ours:
        fix = f"build {strategy.__name__} on {mine}'s strategy and {mine}'s mixin, {fix}"
    return LightningPackageMismatchError(
        f"{strategy.__name__} is lightning-ext's strategy for {theirs}, but {where} is {mine}'s: the two packages"
        f" are separate class hierarchies. Use one package throughout: {fix}. (lightning_ext.{name} is the class for"
        " the package that the importing module imports; see docs/pytorch-lightning.md.)"
    )


def _first_lightning_class(cls: type) -> type | None:
    return next((base for base in cls.__mro__ if base.__module__.partition(".")[0] in _ROOTS), None)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _counterpart(cls: type, package: Package) -> str:
    """``cls``'s name in ``package``: ``pytorch_lightning.callbacks...`` <-> ``lightning.pytorch.callbacks...``."""
    name = _qualified(cls)
    for unified, standalone in RENAMES:
        old, new = (unified, standalone) if package == "pytorch_lightning" else (standalone, unified)
        if name.startswith(old + "."):
            return new + name[len(old) :]
    return name


@cache
def _imported_by(filename: str) -> frozenset[Package]:
    """The Lightning packages a source file imports anywhere (as ``linecache`` holds it, so notebook cells too)."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return frozenset()
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return frozenset(_ROOTS[root] for name in names if (root := name.partition(".")[0]) in _ROOTS)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
