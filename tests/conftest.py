"""Shared fixtures: hypothesis profiles and the persistent rank pools.

Hypothesis profiles (choose with ``HYPOTHESIS_PROFILE=<name>``, default ``ci``):

* ``ci``: quick, for every push (a few dozen examples per property);
* ``quick``: a third of ``ci``, for the reruns of whole suites in another set-up (the native patches), where the
  search itself already ran under ``ci``;
* ``thorough``: many examples, for a run by hand before a release:
  ``HYPOTHESIS_PROFILE=thorough .venv/bin/python -m pytest tests -k property``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers.pool import RankPool

_HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True, suppress_health_check=_HEALTH)
settings.register_profile("quick", parent=settings.get_profile("ci"), max_examples=30)
settings.register_profile("thorough", max_examples=1500, deadline=None, suppress_health_check=_HEALTH)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


class _Pools:
    """One rank pool per world size, started on first use and kept for the whole session."""

    def __init__(self) -> None:
        self._pools: dict[int, RankPool] = {}

    def __call__(self, world_size: int) -> RankPool:
        if world_size not in self._pools:
            self._pools[world_size] = RankPool(world_size)
        return self._pools[world_size]

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


@pytest.fixture(scope="session")
def rank_pools() -> Iterator[_Pools]:
    """``rank_pools(world_size)`` gives a persistent :class:`RankPool` of that size."""
    pools = _Pools()
    yield pools
    pools.close()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under ``LIGHTNING_EXT_EXPECT_NATIVE`` (tests/patches/test_native.py), prove the native seams are in use."""
    expected = os.environ.get("LIGHTNING_EXT_EXPECT_NATIVE")
    if expected:
        import lightning

        import lightning_ext.strategies._runtime

        if lightning_ext.strategies._runtime.patch_mode() != "native" or not lightning.__file__.startswith(expected):
            raise pytest.UsageError(f"expected the patched Lightning at {expected}, got {lightning.__file__}")
