"""lightning-ext adds no host-device synchronization per step: counted, on the CPU as the GPU's proxy.

A synchronization is a call that makes the host wait for the device's result (``aten._local_scalar_dense``: what
``item()``, ``tolist()`` and a tensor's truth value call), counted by a ``TorchDispatchMode`` over ten training steps
that each log five synced values. Stock Lightning reads its SIGTERM broadcast back with ``.item()`` every step
(Lightning #21487); lightning-ext's coordinated stop needs no per-step exchange, the coalesced sync packs and syncs on
the device, and the check stays on the host.
The same count runs with every tensor on a GPU where one is lent (the last test).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

TASK = "tests.helpers.coalesce_tasks:host_syncs_per_step"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_a_step_makes_one_synchronization_fewer_than_stocks(rank_pools: Any, world: int) -> None:
    pool = rank_pools(world)
    stock = pool.run(TASK, (True,), timeout=120)
    ours = pool.run(TASK, (False,), timeout=120)
    per_value = pool.run(TASK, (False, {"log_sync": "per_value"}), timeout=120)
    assert stock == [1.0] * world, stock  # the SIGTERM flag's broadcast, read back every step
    assert ours == [0.0] * world, ours
    assert per_value == [0.0] * world, per_value  # stock's sync per value: on the device, no read-back either


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run it where a GPU is lent)")
def test_on_a_gpu_a_step_makes_one_synchronization_fewer_than_stocks(rank_pools: Any) -> None:
    """The same count with every tensor on the GPU: two ranks share ``cuda:0`` over gloo (one lent GPU)."""
    pool = rank_pools(2)
    stock = pool.run(TASK, (True, None, "cuda"), timeout=120)
    ours = pool.run(TASK, (False, None, "cuda"), timeout=120)
    assert stock == [1.0, 1.0], stock
    assert ours == [0.0, 0.0], ours
