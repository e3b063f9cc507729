"""The suites under ``pytorch_lightning`` too: which objects of a process are ``lightning``'s where none should be.

Written without lightning-ext's mirror, so that it can tell whether the mirror really renamed everything.
"""

from __future__ import annotations

import sys
from types import FunctionType, ModuleType

MARK = "both_packages"
"""The marker of a test that runs a second time, as compiled for ``pytorch_lightning`` (tests/conftest.py)."""

MIRRORS = ("lightning_ext.pytorch_lightning.", "tests.helpers.pytorch_lightning.")
"""Where modules compiled for ``pytorch_lightning`` live (or, for modules that import no Lightning, their aliases)."""


def lightning_objects() -> list[str]:
    """``module: name -> where`` for each global of a module under :data:`MIRRORS` that is ``lightning``'s: a module,
    a function, or a class with a ``lightning`` class among its bases."""
    found = []
    for key, module in list(sys.modules.items()):
        if not key.startswith(MIRRORS) or module is None:
            continue
        for name, value in list(vars(module).items()):
            where = _lightning_origin(value)
            if where is not None:
                found.append(f"{key}: {name} -> {where}")
    return found


def _lightning_origin(value: object) -> str | None:
    if isinstance(value, ModuleType):
        origins = [value.__name__]
    elif isinstance(value, type):
        origins = [base.__module__ for base in value.__mro__]
    elif isinstance(value, FunctionType):
        origins = [value.__module__]
    else:
        return None
    return next((origin for origin in origins if origin == "lightning" or origin.startswith("lightning.")), None)
