"""A package's Lightning-bound modules compiled again for ``pytorch_lightning``, importable under a mirror name."""

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from types import CodeType, ModuleType

from lightning_ext._packages.choice import BOUND_NAMES, MIRROR, RENAMES

__all__ = ["LIGHTNING_EXT", "Mirror"]


class Mirror(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The modules of ``package`` for ``pytorch_lightning``: ``<name>.X`` is ``<package>.X`` with its imports renamed.

    A module that imports Lightning at run time (imports under ``if TYPE_CHECKING:`` do not count), directly or through
    other modules of the package or of the mirrors in ``uses``, is compiled again from its own file, its import
    statements renamed as Lightning renames its standalone packages' sources, and ``<package>`` renamed ``<name>``. It
    keeps its file name and line numbers. Any other module is not loaded twice: its mirror name is the module itself,
    so its classes and state are shared. A package (folder) is always compiled again, so its children are the mirror's.

    Args:
        package: the package mirrored, such as ``"lightning_ext"``.
        name: the mirror's name: a package whose ``__init__`` installs the mirror.
        uses: the mirrors of packages this one imports, renamed with it.

    Example:
        >>> LIGHTNING_EXT.renamed("lightning.pytorch.callbacks"), LIGHTNING_EXT.renamed("lightning_ext.errors")
        ('pytorch_lightning.callbacks', 'lightning_ext.pytorch_lightning.errors')

    """

    def __init__(self, package: str, name: str, uses: Sequence["Mirror"] = ()) -> None:
        self.package, self.name, self.uses = package, name, tuple(uses)

    def renamed(self, module: str) -> str:
        """The name under which ``module`` is imported for ``pytorch_lightning`` (``module`` if it has no other).

        Raises:
            ImportError: a ``lightning`` module without a counterpart in ``pytorch_lightning`` (``lightning.data``).

        """
        if module == "lightning":
            return "pytorch_lightning"
        for old, new in (*RENAMES, *((mirror.package, mirror.name) for mirror in (self, *self.uses))):
            if module == new or module.startswith(new + "."):
                return module
            if module == old or module.startswith(old + "."):
                return new + module[len(old) :]
        if module.startswith("lightning."):
            raise ImportError(f"{module} has no counterpart in pytorch_lightning")
        return module

    @cached_property
    def bound(self) -> frozenset[str]:
        """The modules that import Lightning at run time (for ``lightning_ext``, also its per-package public names)."""
        graph = {name: _imports(name, path) for name, path in self._modules.items()}
        bound = {name for name, imports in graph.items() if any(map(_is_lightning, imports))}
        bound.update(name for mirror in self.uses for name in mirror.bound)
        if self.package == "lightning_ext":
            bound.update(f"lightning_ext.{name}" for name in BOUND_NAMES)
        grown = True
        while grown:
            grown = False
            for name, imports in graph.items():
                if name != self.package and name not in bound and not imports.isdisjoint(bound):
                    bound.add(name)
                    grown = True
        return frozenset(bound)

    def install(self) -> None:
        """Put the mirror first on ``sys.meta_path`` (once), ahead of the finder that would find the originals."""
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def load(self, path: Path) -> ModuleType:
        """The module of the file ``path`` compiled for ``pytorch_lightning`` as a new module, under its mirror name."""
        name = self._name_of(path.resolve(), self.name)
        spec = importlib.util.spec_from_file_location(name, path, loader=self)
        if spec is None:  # pragma: no cover - spec_from_file_location only declines files it cannot name
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        self.exec_module(module)
        return module

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """The spec of ``<name>.X``: ``X``'s file compiled again, or ``X`` itself if it imports no Lightning."""
        if not fullname.startswith(self.name + "."):
            return None
        original = self.package + fullname.removeprefix(self.name)
        source = self._modules.get(original)
        if source is None:
            return None
        if source.name != "__init__.py" and original not in self.bound:
            return importlib.machinery.ModuleSpec(fullname, _Alias(original))
        children: list[str] | None = [] if source.name == "__init__.py" else None  # a package's: from the mirror
        return importlib.util.spec_from_file_location(
            fullname, source, loader=self, submodule_search_locations=children
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        """The default module object."""
        return None

    def exec_module(self, module: ModuleType) -> None:
        """Run the module's file, compiled for ``pytorch_lightning``, in the module."""
        exec(self.code(Path(str(module.__file__))), module.__dict__)

    def code(self, path: Path) -> CodeType:
        """The file ``path`` compiled with its import statements renamed (its own name and line numbers kept)."""
        tree = ast.parse(path.read_bytes(), str(path))
        return compile(_Rename(self, path).visit(tree), str(path), "exec", dont_inherit=True)

    @cached_property
    def _root(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or spec.origin is None:
            raise ImportError(f"cannot mirror {self.package}: it cannot be found")
        return Path(spec.origin).resolve().parent

    @cached_property
    def _modules(self) -> dict[str, Path]:
        return {self._name_of(path, self.package): path for path in sorted(self._root.rglob("*.py"))}

    def _name_of(self, path: Path, package: str) -> str:
        parts = path.relative_to(self._root).with_suffix("").parts
        return ".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])


class _Alias(importlib.abc.Loader):
    """The mirror name of a module that imports no Lightning: the module itself."""

    def __init__(self, original: str) -> None:
        self.original = original

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.original)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran under its own name."""


class _Rename(ast.NodeTransformer):
    """Renames the modules of import statements, as :meth:`Mirror.renamed` says."""

    def __init__(self, mirror: Mirror, path: Path) -> None:
        self.mirror, self.path = mirror, path

    def visit_Import(self, node: ast.Import) -> ast.Import:
        for alias in node.names:
            new = self._renamed(alias.name, node)
            if new != alias.name and alias.asname is None and "." in alias.name:
                # `import a.b` binds `a`, which would still be the original package
                raise ImportError(f"{self.path}:{node.lineno}: `import {alias.name}` cannot be renamed; add `as ...`")
            if new != alias.name:  # `import lightning` is `import pytorch_lightning as lightning`
                alias.asname, alias.name = alias.asname or alias.name, new
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.ImportFrom:
        if node.level == 0 and node.module is not None:
            node.module = self._renamed(node.module, node)
        return node

    def _renamed(self, module: str, node: ast.stmt) -> str:
        try:
            return self.mirror.renamed(module)
        except ImportError as error:
            raise ImportError(f"{self.path}:{node.lineno}: {error}") from None


def _is_lightning(module: str) -> bool:
    return module == "lightning" or module.startswith("lightning.")


def _imports(module: str, path: Path) -> set[str]:
    """What ``module`` imports at run time: each module, and each name ``from`` a module as ``module.name``."""
    tree = ast.parse(path.read_bytes(), str(path))
    skipped = {id(node) for node in _type_checking_only(tree)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
            base = base if node.level else node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _type_checking_only(tree: ast.Module) -> Iterator[ast.AST]:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for statement in node.body:
                yield from ast.walk(statement)


LIGHTNING_EXT = Mirror("lightning_ext", MIRROR)
"""lightning-ext for ``pytorch_lightning``: ``lightning_ext.pytorch_lightning.X`` is ``lightning_ext.X`` renamed."""
