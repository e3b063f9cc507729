"""Register the strategy names (``"ddp_<policy>"``, ...) in Lightning's registry as soon as Lightning is imported.

``import lightning_ext`` must not import Lightning or torch (the ``lightning-ext`` command line starts in well under a
second), yet ``Trainer(strategy="ddp_majority")`` must work after it, in whichever order the two are imported. If
``lightning.pytorch`` is already imported, the names are registered at once; otherwise a one-shot import hook
registers them right after ``lightning.pytorch`` finishes importing.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType

__all__ = ["register_when_lightning_loads"]

_TRIGGER = "lightning.pytorch"
_STRATEGIES = "lightning_ext.strategies.ddp"  # importing it registers the names


def register_when_lightning_loads() -> None:
    """Register now if Lightning is loaded, else once it is (idempotent)."""
    if _TRIGGER in sys.modules:
        _register()
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(_TRIGGER, _register))


def _register() -> None:
    try:
        importlib.import_module(_STRATEGIES)
    except Exception as error:  # never break the user's `import lightning` over our names
        warnings.warn(f"lightning-ext could not register its strategy names: {error!r}", RuntimeWarning, stacklevel=2)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``name`` is imported, lets the other finders load it, then calls ``callback``."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self._name = name
        self._callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # one shot, and out of the way of the search below
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        for finder in sys.meta_path:
            if spec is not None:
                break
            spec = finder.find_spec(fullname, path, target)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module
        callback = self._callback

        def exec_then_register(module: ModuleType) -> None:
            execute(module)
            callback()

        loader.exec_module = exec_then_register  # type: ignore[method-assign]  # this load's loader only
        return spec
