"""Shared fixtures: hypothesis profiles, the persistent rank pools, and the suites' copies for ``pytorch_lightning``.

Hypothesis profiles (choose with ``HYPOTHESIS_PROFILE=<name>``, default ``ci``):

* ``ci``: for every push, randomized: each run searches from a fresh seed, printed at its start and end
  (``hypothesis seed: N``); ``HYPOTHESIS_SEED=N`` (or ``--hypothesis-seed=N``) replays that run's examples;
* ``quick``: a third of ``ci``, for the reruns of whole suites in another set-up (the native patches), where the
  search itself already ran under ``ci``;
* ``thorough``: many examples, for a run by hand before a release:
  ``HYPOTHESIS_PROFILE=thorough .venv/bin/python -m pytest tests -k property``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers.packages import MARK, lightning_objects
from tests.helpers.pool import RankPool, tasks_renamed
from tests.helpers.pytorch_lightning import TESTS

_HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=100, deadline=None, suppress_health_check=_HEALTH)
settings.register_profile("quick", parent=settings.get_profile("ci"), max_examples=30)
settings.register_profile("thorough", max_examples=1500, deadline=None, suppress_health_check=_HEALTH)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SEED_VARIABLE = "HYPOTHESIS_SEED"


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own plugin reads --hypothesis-seed
def pytest_configure(config: pytest.Config) -> None:
    """One seed for every property of this run: ``--hypothesis-seed``, else ``HYPOTHESIS_SEED``, else a fresh one.

    It goes into the environment too, so that the suites this run starts in subprocesses search from the same seed.
    """
    seed = config.getoption("hypothesis_seed", None) or os.environ.get(SEED_VARIABLE)
    if seed is None:
        seed = str(random.SystemRandom().randrange(2**32))
    config.option.hypothesis_seed = str(seed)
    os.environ[SEED_VARIABLE] = str(seed)


def _seed_line(config: pytest.Config) -> str:
    seed = config.option.hypothesis_seed
    return f"hypothesis seed: {seed} (replay this run's examples: {SEED_VARIABLE}={seed} or --hypothesis-seed={seed})"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    terminalreporter.write_line(_seed_line(config))


# Every new TCPStore client makes torch look its server's address up in reverse DNS (for a log line); a resolver that
# drops the query holds the connection for its whole timeout, 5 s by default (about one connection in 12 on this
# project's CI machine). The tests' processes (pools, launched jobs: they inherit this environment) give up after 1 s.
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")


class _Pools:
    """One rank pool per world size, started on first use and kept for the whole session; at most ``LIVE`` of them
    running at once (the least recently used is stopped, and started again when asked for): every pytest-xdist worker
    has pools of its own, and each rank holds torch in memory."""

    LIVE = 2

    def __init__(self) -> None:
        self._pools: dict[int, RankPool] = {}

    def __call__(self, world_size: int) -> RankPool:
        pool = self._pools.pop(world_size, None) or RankPool(world_size)
        self._pools[world_size] = pool  # the most recently used last
        if not pool.running:
            for other in [p for p in self._pools.values() if p is not pool and p.running][: -(self.LIVE - 1) or None]:
                other.close()
        return pool

    def running(self) -> list[RankPool]:
        """The pools whose ranks are up."""
        return [pool for pool in self._pools.values() if pool.running]

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


@pytest.fixture(scope="session")
def rank_pools() -> Iterator[_Pools]:
    """``rank_pools(world_size)`` gives a persistent :class:`RankPool` of that size."""
    pools = _Pools()
    yield pools
    pools.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``pool`` every test that uses the rank pools (``make test-fast`` leaves them out)."""
    for item in items:
        if "rank_pools" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.pool)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Print the run's Hypothesis seed; under ``LIGHTNING_EXT_EXPECT_NATIVE`` (tests/patches/test_native.py), prove
    the native seams are in use."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(_seed_line(session.config))
    expected = os.environ.get("LIGHTNING_EXT_EXPECT_NATIVE")
    if expected:
        import lightning

        import lightning_ext.strategies._runtime

        if lightning_ext.strategies._runtime.patch_mode() != "native" or not lightning.__file__.startswith(expected):
            raise pytest.UsageError(f"expected the patched Lightning at {expected}, got {lightning.__file__}")


# ---- the suites under pytorch_lightning too -------------------------------------------------------------------------
# A test marked `both_packages` runs a second time, as `<module>::pytorch_lightning::<test>`: the same file
# compiled again with its imports renamed for pytorch_lightning (tests/helpers/pytorch_lightning), its rank tasks
# too. After each such test, no module compiled for pytorch_lightning, here or in a rank, holds a `lightning` object.


class _PytorchLightningCopy(pytest.Module):
    """A test module compiled for ``pytorch_lightning``: its marked tests."""

    def _getobj(self) -> ModuleType:
        return TESTS.load(Path(self.path))

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        nodes = super().collect()
        return [node for node in nodes if not isinstance(node, pytest.Item) or node.get_closest_marker(MARK)]


class _Module(pytest.Module):
    """A test module, followed by its copy for ``pytorch_lightning`` when it has marked tests."""

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        nodes = list(super().collect())
        if any(isinstance(node, pytest.Item) and node.get_closest_marker(MARK) for node in nodes):
            copy = _PytorchLightningCopy.from_parent(
                self, path=self.path, name="pytorch_lightning", nodeid=f"{self.nodeid}::pytorch_lightning"
            )
            nodes.append(copy)
        return nodes


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module:
    return _Module.from_parent(parent, path=module_path)


@pytest.fixture(autouse=True)
def _pytorch_lightning_copy(request: pytest.FixtureRequest) -> Iterator[None]:
    """For a test of a copy: its rank tasks compiled for pytorch_lightning; then no `lightning` object anywhere."""
    if not any(isinstance(node, _PytorchLightningCopy) for node in request.node.listchain()):
        yield
        return
    with tasks_renamed(TESTS.renamed):
        yield
    found = lightning_objects()
    if "rank_pools" in request.fixturenames:
        for pool in request.getfixturevalue("rank_pools").running():
            found += [f"rank {rank}: {item}" for rank, items in enumerate(pool.run(_CHECK)) for item in items]
    assert not found, "the pytorch_lightning copy reached lightning:\n" + "\n".join(found)


_CHECK = "tests.helpers.packages:lightning_objects"
