"""Set-up's one exchange: every rank's options and loggers gathered, validated alike, rank 0's choices adopted."""

import uuid
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn

from lightning_ext._collective import RankGroup, all_gather_objects, store_host
from lightning_ext._network import route_address
from lightning_ext._setup import checks as setup_checks
from lightning_ext._stall.monitor import introduction
from lightning_ext.errors import PolicyMismatchError, mark_joint
from lightning_ext.policies import DecisionPolicy

__all__ = ["Agreement", "agree", "invalid_policies"]


@dataclass(frozen=True)
class Agreement:
    """What the ranks agreed on at set-up (rank 0's choices)."""

    namespace: str  # the run's namespace in the store
    log_dir: str | None  # where the per-rank files go, if they are on
    record_dir: str | None  # where the decision record goes, if it is on and there is a logger
    peers: list[Any]  # every rank's introduction to the stall monitor (pid, host; rank 0's: the report's directory)
    routes: list[str | None]  # every rank's route to MASTER_ADDR: where the hang checks' channel binds


def agree(
    trainer: Any, ranks: RankGroup, options: tuple[str, ...], invalid: str | None, per_rank: bool, record: bool
) -> Agreement:
    """One gather; then every rank validates what every rank brought, and raises alike.

    Validation comes after the gather so that no rank raises while the others wait in it. Each rank resolving its
    own logger version is a known Lightning bug (#18294, #8945): the ranks adopt rank 0's.
    """
    first = ranks.rank == 0
    logger_dir = _logger_dir(trainer) if first else None
    mine = {
        "options": options,
        "invalid": invalid,
        "loggers": None if trainer is None else len(_versioned_loggers(trainer)),
        "versions": _logger_versions(trainer) if first else None,
        # as Trainer.log_dir defines them (without its broadcast)
        "log_dir": (logger_dir or str(trainer.default_root_dir)) if first and per_rank else None,
        "record_dir": logger_dir if record else None,
        "namespace": f"lightning_ext/{uuid.uuid4().hex}/" if first else None,
        "init_module": setup_checks.init_module_state(trainer),
        "stall": introduction((logger_dir or str(trainer.default_root_dir)) if first and trainer is not None else None),
        "route": route_address(store_host()),
    }
    everyone = all_gather_objects(mine, ranks)
    try:
        _validate(everyone)
    except Exception as error:  # every rank saw the same data, so every rank raises this
        raise mark_joint(error) from None
    warning = setup_checks.init_module_warning([theirs["init_module"] for theirs in everyone])
    if warning is not None:
        rank_zero_warn(warning)
    if trainer is not None and everyone[0]["versions"] is not None:
        for logger, version in zip(_versioned_loggers(trainer), everyone[0]["versions"], strict=True):
            logger._version = version
    peers, routes = [theirs["stall"] for theirs in everyone], [theirs["route"] for theirs in everyone]
    return Agreement(everyone[0]["namespace"], everyone[0]["log_dir"], everyone[0]["record_dir"], peers, routes)


def invalid_policies(
    checkpoint: DecisionPolicy, early_stopping: DecisionPolicy, preemption: DecisionPolicy | None, world_size: int
) -> str | None:
    """What is wrong with the policies at this world size (checked locally, reported after the gather)."""
    named = [("checkpoint_policy", checkpoint), ("early_stopping_policy", early_stopping)]
    for name, policy in named + ([("preemption_policy", preemption)] if preemption is not None else []):
        try:
            policy.validate(world_size)
        except ValueError as error:
            return f"{name}={policy!r}: {error}"
    return None


def _validate(everyone: list[dict[str, Any]]) -> None:
    """Raise the same error on every rank if the ranks' set-up disagrees or is invalid (every rank sees everything)."""
    invalid = [(rank, theirs["invalid"]) for rank, theirs in enumerate(everyone) if theirs["invalid"]]
    if invalid:
        listing = "; ".join(f"rank {rank}: {problem}" for rank, problem in invalid)
        raise ValueError(f"Invalid decision policy: {listing}")
    if any(theirs["options"] != everyone[0]["options"] for theirs in everyone):
        listing = "; ".join(
            f"rank {rank}: checkpoint_policy={theirs['options'][0]}, early_stopping_policy={theirs['options'][1]},"
            f" per_rank_metrics={theirs['options'][2]}, hang checks={theirs['options'][3]},"
            f" decision_record={theirs['options'][4]}, preemption_policy={theirs['options'][5]}, {theirs['options'][6]}"
            for rank, theirs in enumerate(everyone)
        )
        raise PolicyMismatchError(f"The strategy is configured differently on different ranks: {listing}")
    counts = [theirs["loggers"] for theirs in everyone]
    if len(set(counts)) > 1:
        listing = ", ".join(f"rank {rank}: {count}" for rank, count in enumerate(counts))
        raise PolicyMismatchError(
            f"The ranks configured different numbers of CSV/TensorBoard loggers ({listing}); every rank must configure"
            " the same loggers"
        )


def _versioned_loggers(trainer: Any) -> list[CSVLogger | TensorBoardLogger]:
    """The loggers that pick a ``version_N`` directory on their own (the ones that can disagree across ranks)."""
    return [logger for logger in trainer.loggers if isinstance(logger, (CSVLogger, TensorBoardLogger))]


def _logger_versions(trainer: Any) -> list[int | str | None] | None:
    if trainer is None:
        return None
    return [logger.version for logger in _versioned_loggers(trainer)]


def _logger_dir(trainer: Any) -> str | None:
    """The first logger's directory, if the trainer has a logger with one."""
    if trainer is None or not trainer.loggers:
        return None
    first = trainer.loggers[0]
    directory = first.log_dir if isinstance(first, (TensorBoardLogger, CSVLogger)) else first.save_dir
    return None if directory is None else str(directory)
