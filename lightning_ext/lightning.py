"""lightning-ext for ``lightning``: every public name, its strategies built on ``lightning.pytorch``'s.

``from lightning_ext.lightning import PolicyDDPStrategy`` chooses the package explicitly; ``lightning_ext.X`` chooses
it for you (see docs/pytorch-lightning.md).
"""

from typing import Any

import lightning_ext

__all__ = list(lightning_ext.__all__)
__version__ = lightning_ext.__version__


def __getattr__(name: str) -> Any:
    return lightning_ext._public(name, "lightning")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
