"""What the check knows by name agrees with Lightning, torch and the hang checks, read from them here (the check
itself imports none of them)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import lightning.pytorch as pl
import torch.distributed as dist
from lightning.pytorch import demos as demos_package
from lightning.pytorch.trainer.connectors.logger_connector.fx_validator import _FxValidator

from lightning_ext._torch_collectives import COLLECTIVES, POINT_TO_POINT
from lightning_ext.check import catalogue
from lightning_ext.check.catalogue import (
    NO_LOGGING_HOOKS,
    RANK_ATTRIBUTES,
    RANK_ENVIRONMENT,
    RANK_FUNCTIONS,
    RANK_WORDS,
    STEP_HOOKS,
    STRATEGY_CODES,
    TORCH_COLLECTIVES,
)

# DDP's own broadcast of its buffers, which it makes on every rank itself: not a user's call
NOT_USER_CALLS = {"_broadcast_coalesced"}


def test_the_calls_known_by_name_are_every_exchange_torch_distributed_has() -> None:
    """A function torch adds that exchanges (as 2.13 added the ``_single`` names) must be listed, or the hang checks
    would not count it and the check would not see it under a rank guard; every listed name is torch's."""
    exchanges = re.compile("gather|reduce|scatter|broadcast|barrier|all_to_all|send|recv")
    functions = {
        name
        for name, value in vars(dist).items()
        if exchanges.search(name) and callable(value) and not inspect.isclass(value) and not name.startswith("__")
    }
    assert functions - NOT_USER_CALLS == set(COLLECTIVES) | set(POINT_TO_POINT)
    assert set(COLLECTIVES) == TORCH_COLLECTIVES  # what the check finds in source, the hang checks count


def test_the_hooks_logging_defaults_are_lightnings() -> None:
    functions = _FxValidator.functions
    assert {name for name, options in functions.items() if options is None} == NO_LOGGING_HOOKS
    step = {name for name, options in functions.items() if options is not None and options["default_on_step"]}
    assert step == STEP_HOOKS


def test_the_strategy_collectives_are_lightnings_strategy_methods() -> None:
    for name in STRATEGY_CODES:
        assert callable(getattr(pl.strategies.Strategy, name)), name


def test_the_lightning_classes_recognised_by_name_are_what_the_rule_says() -> None:
    """Every class ``lightning.pytorch.callbacks`` exports is a Callback; a class of Lightning's demos is a
    LightningModule exactly when its name ends with Model or starts with Lightning."""
    exported = [getattr(pl.callbacks, name) for name in pl.callbacks.__all__]
    assert all(issubclass(value, pl.Callback) for value in exported if inspect.isclass(value))
    demos = {
        name: value
        for info in pkgutil.iter_modules(demos_package.__path__)
        for name, value in vars(importlib.import_module(f"{demos_package.__name__}.{info.name}")).items()
        if inspect.isclass(value) and value.__module__.startswith(demos_package.__name__)
    }
    named = {name for name in demos if name.endswith("Model") or name.startswith("Lightning")}
    assert {"BoringModel", "DemoModel", "LightningTransformer"} <= named
    assert named == {name for name, value in demos.items() if issubclass(value, pl.LightningModule)}


def test_every_rank_source_holds_a_rank_word_so_a_file_without_one_needs_no_reading() -> None:
    names = [*RANK_ATTRIBUTES, *RANK_FUNCTIONS, *RANK_ENVIRONMENT, "rank_zero_only"]
    assert all(any(word in name for word in RANK_WORDS) for name in names), names
    assert TORCH_COLLECTIVES | set(STRATEGY_CODES) <= catalogue.COLLECTIVE_NAMES
