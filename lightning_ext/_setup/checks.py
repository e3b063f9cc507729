"""The set-up checks of a run: a dataloader that would fail at its first batch, and a run inside ``init_module``."""

import contextlib
import inspect
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from lightning_ext._collective import RankGroup, all_gather_objects, gather_rows
from lightning_ext._rank_lists import ranks_text
from lightning_ext._setup.loaders import dataset_failure, failing_draws
from lightning_ext.errors import DataLoaderSetupError, InitModuleWarning, mark_joint

__all__ = ["Finding", "SetupChecks", "before_iteration", "init_module_state", "inside_init_module", "start", "stop"]

_LIGHTNING_ERROR = 'which Lightning reports as "Please call `iter(combined_loader)` first"'

_INIT_MODULE_DEPTH = [0]  # how many tensor_init_context blocks this process is in (never pickled to a spawned rank)


@contextlib.contextmanager
def inside_init_module() -> Iterator[None]:
    """Around the strategy's ``tensor_init_context``, which ``trainer.init_module()`` enters."""
    _INIT_MODULE_DEPTH[0] += 1
    try:
        yield
    finally:
        _INIT_MODULE_DEPTH[0] -= 1


def init_module_state(trainer: Any) -> tuple[str, str] | None:
    """What this rank brings to the set-up exchange: ``(the stage, the default device)`` if this run is inside
    ``trainer.init_module()`` (entered before the run's set-up), else ``None``."""
    if not _INIT_MODULE_DEPTH[0]:
        return None
    stage = getattr(getattr(getattr(trainer, "state", None), "fn", None), "value", None) or "fit"
    return stage, str(torch.get_default_device())


def init_module_warning(states: list[tuple[str, str] | None]) -> InitModuleWarning | None:
    """The warning every rank agrees on, from every rank's :func:`init_module_state` (``None`` if no rank is inside)."""
    inside = [rank for rank, state in enumerate(states) if state is not None]
    if not inside:
        return None
    stage, device = next(state for state in states if state is not None)
    return InitModuleWarning(
        f"trainer.{stage}() runs inside `with trainer.init_module():` on {ranks_text(inside, None)} (the default device"
        f" there is {device}). init_module is for building the model only: every tensor the run makes is made on that"
        " device and dtype, with empty_init=True the modules built during the run (configure_model) are left"
        " uninitialised, and on a GPU a shuffling dataloader fails at its first batch. Create the model inside it,"
        f" then call trainer.{stage}() after the `with` block."
    )


@dataclass(frozen=True)
class Finding:
    """Why one dataloader of one rank would fail at its first batch."""

    loader: str
    source: str
    problems: tuple[str, ...]
    cause: str  # "generator", "init_module", "default device" or "dataset"
    run: str = "fit"  # the trainer's function: fit, validate, test, predict
    generator: str = ""
    on: str = ""

    def describe(self) -> str:
        where = f" ({self.source})" if self.source else ""
        return f"the {self.loader}{where}: " + "; ".join(self.problems)


class SetupChecks:
    """The set-up checks of one rank in one run: each combined loader is checked once, before its first batch.

    Args:
        ranks: the ranks of the run (the training group).
        trainer: the trainer, for the names of the dataloaders.

    """

    def __init__(self, ranks: RankGroup, trainer: Any) -> None:
        self._ranks = ranks
        self._trainer = trainer
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()

    def before_iteration(self, combined_loader: Any) -> None:
        """Check the loaders a loop is about to iterate; every rank raises the same error if any rank found one.

        Every loop sets up its fetcher with a combined loader before each run; a loader reused from the last run (the
        validation loop's, epoch after epoch) is not checked again, and neither is anything per step. The loops reach
        here on every rank alike, so one exchange of one number per new combined loader lines the ranks up.
        """
        if combined_loader in self._seen:
            return
        self._seen.add(combined_loader)
        findings = self._find(combined_loader)
        if self._ranks.world_size > 1:
            flags = gather_rows([int(bool(findings))], self._ranks)
            if not any(row[0] for row in flags):
                return
            everyone: list[list[Finding]] = all_gather_objects(findings, self._ranks)  # the error path only
        elif not findings:
            return
        else:
            everyone = [findings]
        raise mark_joint(DataLoaderSetupError(setup_message(everyone)))

    def _find(self, combined_loader: Any) -> list[Finding]:
        default = torch.get_default_device()
        init_module = _INIT_MODULE_DEPTH[0] > 0
        accelerator = bool(torch.accelerator.is_available())
        prefix, loop = _stage(self._trainer)
        loaders = list(getattr(combined_loader, "flattened", []))
        found = []
        for index, loader in enumerate(loaders):
            draws = failing_draws(loader, default)
            dataset = dataset_failure(loader, accelerator)
            if not draws and dataset is None:
                continue
            name = f"{prefix} dataloader" + (f" {index}" if len(loaders) > 1 or prefix != "train" else "")
            problems = tuple(draw.what for draw in draws) + ((dataset,) if dataset else ())
            if draws and default.type != "cpu":
                cause = "init_module" if init_module else "default device"
            else:
                cause = "generator" if draws else "dataset"
            first = draws[0] if draws else None
            generator, on = (first.generator.type, first.on.type) if first else ("", "")
            run = getattr(getattr(self._trainer.state, "fn", None), "value", None) or "fit"
            found.append(Finding(name, _source(loop), problems, cause, run, generator, on))
        return found


def setup_message(everyone: list[list[Finding]]) -> str:
    """The error every rank raises, from every rank's findings (the same data on every rank, the same message)."""
    lines = ["A dataloader would fail at its first batch, so the run stops before it:"]
    grouped: dict[str, list[int]] = {}
    for rank, findings in enumerate(everyone):
        for finding in findings:
            grouped.setdefault(finding.describe(), []).append(rank)
    lines += [f"  {ranks_text(ranks)}: {text}" for text, ranks in grouped.items()]
    first = next(finding for findings in everyone for finding in findings)
    if first.cause == "init_module":
        lines.append(
            f"  The run is inside `with trainer.init_module():`, where the default device is {first.on}: samplers draw"
            f" their indices there, with CPU generators. {_pytorch_error(first)}."
        )
        lines.append(
            "Fix: init_module is for building the model only. Create the model inside it, then call"
            f" trainer.{first.run}() (and build your data) after the `with` block."
        )
    elif first.cause == "default device":
        lines.append(
            f"  The default device is {first.on} (torch.set_default_device, or a `with torch.device(...)` block around"
            f" the run): samplers draw their indices there, with CPU generators. {_pytorch_error(first)}."
        )
        lines.append("Fix: run the trainer with the CPU as the default device; Lightning moves each batch itself.")
    elif first.cause == "generator":
        lines.append(f"  {_pytorch_error(first)}.")
        lines.append(
            "Fix: drop the generator, or make it a CPU one: torch.Generator().manual_seed(seed) (a DataLoader and its"
            " samplers draw their indices on the CPU; Lightning moves each batch to the device)."
        )
    else:
        lines.append(
            "Fix: build the dataset outside trainer.init_module() (init_module is for the model only) so that its"
            " tensors stay on the CPU, or set pin_memory=False and num_workers=0 to keep the data on the device."
        )
    return "\n".join(lines)


def _pytorch_error(finding: Finding) -> str:
    """What PyTorch raises for the first failing draw, and what Lightning shows instead."""
    if finding.on == "meta":
        return f"PyTorch cannot draw on meta (a meta tensor has no values), {_LIGHTNING_ERROR}"
    expected, found = finding.on, finding.generator
    raised = f"Expected a '{expected}' device type for generator but found '{found}'"
    return f'PyTorch would raise "{raised}", {_LIGHTNING_ERROR}'


def _stage(trainer: Any) -> tuple[str, Any]:
    """The dataloaders' prefix (``train``, ``val``, ``test``, ``predict``) and the loop that holds their source."""
    stage = getattr(getattr(getattr(trainer, "state", None), "stage", None), "value", "")
    with contextlib.suppress(AttributeError):  # a trainer without those loops: no source to look at
        if stage == "train":
            return "train", trainer.fit_loop
        if stage == "predict":
            return "predict", trainer.predict_loop
        return ("test" if stage == "test" else "val"), trainer._evaluation_loop
    return "val" if stage in ("sanity_check", "validate") else stage or "", None


def _source(loop: Any) -> str:
    """Where the loaders come from: ``MyModel.train_dataloader (model.py:42)``, or what was passed to the trainer."""
    source = getattr(loop, "_data_source", None)
    if source is None:
        return ""
    instance, name = source.instance, source.name
    method = getattr(type(instance), name, None)
    if not callable(method):
        return "passed to the trainer"
    with contextlib.suppress(OSError, TypeError):
        file = inspect.getsourcefile(method)
        line = inspect.getsourcelines(method)[1]
        return f"{type(instance).__name__}.{name}, {os.path.basename(file or '?')}:{line}"
    return f"{type(instance).__name__}.{name}"


_ACTIVE: list[SetupChecks] = []


def start(checks: SetupChecks) -> None:
    """Check the loaders of this run (the strategy calls this at set-up, on every rank)."""
    _ACTIVE[:] = [checks]


def stop() -> None:
    """Stop checking (teardown)."""
    _ACTIVE.clear()


def before_iteration(combined_loader: Any) -> None:
    """The seam in ``_DataFetcher.setup``: every loop calls it right before it iterates its loaders."""
    if _ACTIVE:
        _ACTIVE[0].before_iteration(combined_loader)
