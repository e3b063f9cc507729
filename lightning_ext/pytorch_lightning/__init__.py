"""lightning-ext for ``pytorch_lightning``: every public name, its strategies built on ``pytorch_lightning``'s.

``from lightning_ext.pytorch_lightning import PolicyDDPStrategy`` chooses the package explicitly; ``lightning_ext.X``
chooses it for you (see docs/pytorch-lightning.md). The package is also where lightning-ext's modules are compiled
for ``pytorch_lightning``: ``lightning_ext.pytorch_lightning.strategies.ddp`` is ``lightning_ext.strategies.ddp``.
"""

from typing import Any

import lightning_ext
from lightning_ext._packages.mirror import LIGHTNING_EXT

LIGHTNING_EXT.install()

__all__ = list(lightning_ext.__all__)
__version__ = lightning_ext.__version__


def __getattr__(name: str) -> Any:
    return lightning_ext._public(name, "pytorch_lightning")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
