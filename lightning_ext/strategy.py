"""``PolicyDDPStrategy``: ``DDPStrategy`` with pluggable cross-rank decisions for ``ModelCheckpoint``/``EarlyStopping``.

The strategy is a thin seam: it carries the policies and checks at set-up that every rank carries the same ones. The
decisions themselves live in :mod:`lightning_ext.decisions`, reached from the callbacks through the seams of
:mod:`lightning_ext._runtime` (or of a Lightning patched with ``patches/``).
"""

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from torch.distributed.constants import default_pg_timeout
from typing_extensions import override

from lightning_ext import _runtime
from lightning_ext._collective import RankGroup, all_gather_objects
from lightning_ext.errors import PolicyMismatchError
from lightning_ext.policies import DecisionPolicy, PolicyLike, available_policies, resolve_policy

__all__ = ["PolicyDDPStrategy"]


class PolicyDDPStrategy(DDPStrategy):
    """DDP whose ``ModelCheckpoint`` and ``EarlyStopping`` decisions follow the policies you choose.

    Takes every :class:`~lightning.pytorch.strategies.DDPStrategy` argument, plus:

    Args:
        checkpoint_policy: how ranks agree to save a new top-k checkpoint. Default ``"all"`` (stock Lightning).
        early_stopping_policy: how ranks agree to stop. Default ``"any"`` (stock Lightning).

    A policy is a name from :func:`~lightning_ext.policies.available_policies` or a
    :class:`~lightning_ext.policies.DecisionPolicy` object such as ``Quorum(2)``. Whatever the policy, every rank
    ends each decision with the same decision, the same checkpoint paths and the same ``trainer.should_stop``, and a
    metric logged on some ranks only raises the same error on every rank instead of hanging.

    Example:
        >>> strategy = PolicyDDPStrategy(checkpoint_policy="mean", early_stopping_policy="majority")
        >>> strategy.checkpoint_policy, strategy.early_stopping_policy
        (AggregatePolicy('mean'), Majority())

    """

    strategy_name = "ddp_policy"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        model_averaging_period: int | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        *,
        checkpoint_policy: PolicyLike = "all",
        early_stopping_policy: PolicyLike = "any",
        **kwargs: Any,
    ) -> None:
        _runtime.install()
        if not _runtime.seams_available():
            raise RuntimeError(
                "lightning-ext cannot reach Lightning's callbacks: the installed Lightning is not patched and runtime"
                " patching is switched off (LIGHTNING_EXT_RUNTIME_PATCHING=0). Apply the seams with"
                " `python -m lightning_ext.patches apply`, or unset the variable."
            )
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            ddp_comm_state=ddp_comm_state,
            ddp_comm_hook=ddp_comm_hook,
            ddp_comm_wrapper=ddp_comm_wrapper,
            model_averaging_period=model_averaging_period,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **kwargs,
        )
        self._checkpoint_policy = resolve_policy(checkpoint_policy)
        self._early_stopping_policy = resolve_policy(early_stopping_policy)

    @property
    def checkpoint_policy(self) -> DecisionPolicy:
        """The policy of the ``ModelCheckpoint`` top-k decision."""
        return self._checkpoint_policy

    @property
    def early_stopping_policy(self) -> DecisionPolicy:
        """The policy of the ``EarlyStopping`` stop decision."""
        return self._early_stopping_policy

    @override
    def setup_environment(self) -> None:
        _runtime.install()  # a spawned or re-launched process imports us afresh
        super().setup_environment()
        self._check_policies()

    def _check_policies(self) -> None:
        """Every rank must carry the same policies, and each must work at this world size (one gather, at set-up)."""
        for policy in (self._checkpoint_policy, self._early_stopping_policy):
            policy.validate(self.world_size)
        if self.world_size == 1:
            return
        mine = (self._checkpoint_policy.describe(), self._early_stopping_policy.describe())
        everyone = all_gather_objects(mine, RankGroup.from_strategy(self))
        if any(theirs != everyone[0] for theirs in everyone):
            listing = "; ".join(
                f"rank {rank}: checkpoint_policy={theirs[0]}, early_stopping_policy={theirs[1]}"
                for rank, theirs in enumerate(everyone)
            )
            raise PolicyMismatchError(f"PolicyDDPStrategy is configured differently on different ranks: {listing}")

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``"ddp_policy"`` (stock rules) and ``"ddp_<policy>"`` for each built-in policy name.

        ``"ddp_<name>"`` uses that policy for both the checkpoint and the early-stopping decision; ``"ddp_all"`` is
        ``all`` for both, unlike ``"ddp_policy"`` (``all`` for checkpoints, ``any`` for stopping, as stock).

        """
        entries: dict[str, dict[str, Any]] = {cls.strategy_name: {}}
        for name in available_policies():
            entries[f"ddp_{name}"] = {"checkpoint_policy": name, "early_stopping_policy": name}
        for name, init_params in entries.items():
            if name in strategy_registry:
                continue
            rules = init_params or {"checkpoint_policy": "all", "early_stopping_policy": "any"}
            strategy_registry.register(
                name,
                cls,
                description=(
                    f"DDP with checkpoint_policy={rules['checkpoint_policy']!r} and"
                    f" early_stopping_policy={rules['early_stopping_policy']!r} (lightning-ext)"
                ),
                **init_params,
            )


PolicyDDPStrategy.register_strategies(StrategyRegistry)
