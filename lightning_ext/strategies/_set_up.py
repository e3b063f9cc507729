"""Set-up's one exchange: every rank's options and loggers gathered, validated alike, rank 0's choices adopted."""

import uuid
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn

from lightning_ext._checks.messages import first_line
from lightning_ext._collective import RankGroup, all_gather_objects, store_host
from lightning_ext._network import route_address
from lightning_ext._per_rank.sinks import run_identities
from lightning_ext._rank_lists import ranks_text
from lightning_ext._setup import checks as setup_checks
from lightning_ext._stall.monitor import Introduction, introduction
from lightning_ext._watch.rank_text import shortened
from lightning_ext.errors import PolicyMismatchError, mark_joint
from lightning_ext.policies import DecisionPolicy

__all__ = ["Agreement", "agree", "invalid_policies"]


@dataclass(frozen=True)
class Agreement:
    """What the ranks agreed on at set-up (rank 0's choices)."""

    namespace: str  # the run's namespace in the store
    log_dir: str | None  # where the per-rank files go, if they are on
    record_dir: str | None  # where the decision record goes, if it is on and there is a logger
    peers: list[Introduction]  # every rank's introduction to the stall monitor
    runs: list[Any] | None  # with per-rank files: each logger's main run as rank 0 made it, for the ranks' own runs
    routes: list[str | None]  # every rank's route to MASTER_ADDR: where the hang checks' channel binds


def agree(
    trainer: Any,
    ranks: RankGroup,
    options: dict[str, tuple[str, str]],
    invalid: str | None,
    per_rank: bool,
    record: bool,
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
        "runs": run_identities(trainer) if first and per_rank else None,  # MLflow's, W&B's run id: only rank 0 has it
        "namespace": f"lightning_ext/{uuid.uuid4().hex}/" if first else None,
        "init_module": setup_checks.init_module_state(trainer),
        "stall": introduction((logger_dir or str(trainer.default_root_dir)) if first and trainer is not None else None),
        "route": route_address(store_host()),
    }
    everyone = all_gather_objects(mine, ranks)
    try:
        _validate(everyone)
    except (ValueError, PolicyMismatchError) as error:  # every rank saw the same data, so every rank raises this
        raise mark_joint(error) from None
    warning = setup_checks.init_module_warning([theirs["init_module"] for theirs in everyone])
    if warning is not None:
        rank_zero_warn(warning)
    if trainer is not None and everyone[0]["versions"] is not None:
        for logger, version in zip(_versioned_loggers(trainer), everyone[0]["versions"], strict=True):
            logger._version = version
    peers, routes = [theirs["stall"] for theirs in everyone], [theirs["route"] for theirs in everyone]
    first_rank = everyone[0]
    return Agreement(
        first_rank["namespace"], first_rank["log_dir"], first_rank["record_dir"], peers, first_rank["runs"], routes
    )


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
    differing = _differing_options([theirs["options"] for theirs in everyone])
    if differing:
        raise PolicyMismatchError(differing)
    counts = [theirs["loggers"] for theirs in everyone]
    if len(set(counts)) > 1:
        listing = ", ".join(f"rank {rank}: {count}" for rank, count in enumerate(counts))
        raise PolicyMismatchError(
            f"The ranks configured different numbers of CSV/TensorBoard loggers ({listing}); every rank must configure"
            " the same loggers"
        )


def _differing_options(options: list[dict[str, tuple[str, str]]]) -> str | None:
    """The message naming the options that differ between ranks (each rank's ``StrategyOptions.described()``), with
    each value and the ranks that gave it, or ``None`` if every rank gave the same options.

    Example:
        >>> print(_differing_options([{"log_sync": ("'coalesced'",) * 2}, {"log_sync": ("'per_value'",) * 2}] * 2))
        The strategy's log_sync differs between ranks: 'coalesced' on ranks 0 and 2, but 'per_value' on ranks 1 and 3.
        Fix: pass the same options on every rank.
          log_sync: 'coalesced' on ranks 0 and 2; 'per_value' on ranks 1 and 3

    """
    lines, heads = [], []
    for name in options[0]:
        by_value: dict[str, tuple[str, list[int]]] = {}
        for rank, theirs in enumerate(options):
            identity, text = theirs[name]
            by_value.setdefault(identity, (text, []))[1].append(rank)
        if len(by_value) == 1:
            continue
        groups = list(by_value.values())
        lines.append(f"  {name}: " + "; ".join(f"{text} on {ranks_text(ranks)}" for text, ranks in groups))
        rest = sum(len(ranks) for _, ranks in groups[2:])
        heads.append(
            f"The strategy's {name} differs between ranks: "
            + ", but ".join(f"{shortened(text, 50)} on {ranks_text(ranks, 3)}" for text, ranks in groups[:2])
            + (f", and other values on {rest} more rank(s)" if rest else "")
            + "."
        )
    if not lines:
        return None
    names = [line.split(":")[0].strip() for line in lines]
    head = heads[0] if len(heads) == 1 else f"The strategy's options differ between ranks: {', '.join(names)}."
    return "\n".join([first_line(head, "Fix: pass the same options on every rank."), *lines])


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
