"""Real strategies, a trainer stand-in and a truly stock Lightning, for timing decisions outside a ``Trainer``.

The strategies are real: a ``DDPStrategy`` (or ``PolicyDDPStrategy``) with one device per rank and a
``LightningEnvironment`` that reads ``LOCAL_RANK``/``NODE_RANK`` from the environment, after ``set_world_ranks()``,
so ``reduce``, ``root_device``, ``world_size`` and ``global_rank`` are the ones a ``Trainer`` would use. Only the
trainer is a stand-in: it carries what ``ModelCheckpoint`` and ``EarlyStopping`` read from a trainer and nothing
else; every exchange goes through ``torch.distributed`` for real.

:func:`stock_lightning` takes lightning-ext's runtime seams out of Lightning for the duration of a block, so that
stock subjects run Lightning's own, unwrapped methods and pay none of lightning-ext's dispatch cost.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from lightning.fabric.plugins.environments.lightning import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

from lightning_ext.strategies import PolicyDDPStrategy, _runtime

__all__ = ["policy_strategy", "stock_lightning", "stock_strategy"]


def stock_strategy(device: torch.device, world_size: int) -> DDPStrategy:
    """A stock ``DDPStrategy`` for this rank, its world ranks set from the environment (``LOCAL_RANK`` etc.)."""
    strategy = DDPStrategy(parallel_devices=[device] * world_size, cluster_environment=LightningEnvironment())
    strategy.set_world_ranks()
    _check_world(strategy, world_size)
    return strategy


def policy_strategy(device: torch.device, world_size: int, *, policy: str) -> PolicyDDPStrategy:
    """A ``PolicyDDPStrategy`` with ``policy`` for both decisions, set up exactly as :func:`stock_strategy`."""
    strategy = PolicyDDPStrategy(
        parallel_devices=[device] * world_size,
        cluster_environment=LightningEnvironment(),
        checkpoint_policy=policy,
        early_stopping_policy=policy,
    )
    strategy.set_world_ranks()
    _check_world(strategy, world_size)
    return strategy


def _check_world(strategy: DDPStrategy, world_size: int) -> None:
    if strategy.world_size != world_size or not 0 <= strategy.global_rank < world_size:
        raise RuntimeError(
            f"{type(strategy).__name__} sees world size {strategy.world_size} and rank {strategy.global_rank},"
            f" expected world size {world_size}: are LOCAL_RANK and NODE_RANK set?"
        )


@contextmanager
def stock_lightning() -> Iterator[None]:
    """Within the block, Lightning's methods are its own: lightning-ext's runtime seams are taken out, then put back.

    On a Lightning patched with ``patches/`` (``lightning_ext.patches.patch_mode() == "native"``) the seams are in
    Lightning's source and stay; they fall through to the stock body for a strategy without hooks.
    """
    swapped: list[tuple[type, str, Any]] = []
    for owner, name, _ in _runtime._all_seams():  # the decision seams and the hang checks' alike
        wrapper = owner.__dict__.get(name)
        function = wrapper.fget if isinstance(wrapper, property) else wrapper
        original = getattr(function, "__wrapped__", None)
        if getattr(function, _runtime._MARKER, False) and original is not None:
            if isinstance(wrapper, property):
                original = property(original, wrapper.fset, wrapper.fdel, wrapper.__doc__)
            setattr(owner, name, original)
            swapped.append((owner, name, wrapper))
    try:
        yield
    finally:
        for owner, name, wrapper in swapped:
            setattr(owner, name, wrapper)
