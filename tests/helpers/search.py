"""How many examples each property test searches per world size, under the Hypothesis profile in use.

A CI run (``.ci/run``) runs the suite twice, under Lightning 2.6 and 2.5, each from its own random seed
(``tests/conftest.py``), so a property that runs ``n`` examples per world size in each suite searches ``2 n`` per CI
run. Every property searches at least :data:`PER_CI_RUN` per world size per CI run under the ``ci`` profile: the
properties whose examples are cheap run that many in each suite, those whose examples are whole ``Trainer.fit`` runs
half of it in each (:data:`PER_SUITE_FIT`), to keep the suite within its time budget.
"""

import math

from hypothesis import settings

__all__ = ["PER_CI_RUN", "PER_SUITE_CHEAP", "PER_SUITE_FIT", "SUITES_PER_CI_RUN", "examples"]

PER_CI_RUN = 25
SUITES_PER_CI_RUN = 2  # `make test` (Lightning 2.6) and `make test-lightning-2.5`, each with a fresh seed
PER_SUITE_CHEAP = PER_CI_RUN  # an example is one exchange or one check in the rank pools
PER_SUITE_FIT = math.ceil(PER_CI_RUN / SUITES_PER_CI_RUN)  # an example is a Trainer.fit (or two) in the rank pools


def examples(per_suite: int) -> int:
    """``per_suite`` scaled by the profile: as is under ``ci`` (100 examples), 15x under ``thorough``."""
    return max(1, round(per_suite * settings().max_examples / 100))
