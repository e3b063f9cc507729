"""The tests compiled for ``pytorch_lightning``: ``tests.helpers.pytorch_lightning.X`` is ``tests.X``, imports renamed.

The suites' copies for ``pytorch_lightning`` (tests/conftest.py) and their rank tasks are loaded from here, with the
mirror that serves lightning-ext itself (``lightning_ext/_packages/mirror.py``).
"""

from lightning_ext._packages.mirror import LIGHTNING_EXT, Mirror

TESTS = Mirror("tests", __name__, uses=(LIGHTNING_EXT,))
TESTS.install()
