"""Which classes are LightningModules or Callbacks: by their bases, in the file, in Lightning, or in another file
checked with it (``class Model(BaseModel)`` with ``BaseModel`` a LightningModule of ``models/base.py``)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from pathlib import Path

from lightning_ext.check.catalogue import CALLBACK_BASES, LIGHTNING_PACKAGES, MODULE_BASES
from lightning_ext.check.names import Imports, last_name

__all__ = ["CALLBACK", "MODULE_CLASS", "Index", "Lookup", "kind_of_base", "no_lookup"]

Lookup = Callable[[str], "str | None"]

CALLBACK, MODULE_CLASS = "callback", "module"


def kind_of_base(base: ast.expr, imports: Imports, local: Mapping[str, str], lookup: Lookup) -> str | None:
    """What a base class makes a class: ``MODULE_CLASS``, ``CALLBACK`` or ``None``.

    Args:
        base: the base, as written.
        imports: the file's imports.
        local: the kinds of the file's own classes found so far, by name.
        lookup: the kind of a class of another file checked, by its dotted name (:meth:`Index.kind`).

    """
    name = last_name(base)
    if name in MODULE_BASES:
        return MODULE_CLASS
    if name in CALLBACK_BASES:
        return CALLBACK
    if isinstance(base, ast.Name) and base.id in local:
        return local[base.id]
    dotted = imports.resolve(base)
    if dotted is None or name is None:
        return None
    if dotted.split(".")[0] in LIGHTNING_PACKAGES:
        if ".callbacks." in dotted:  # every class that Lightning's callbacks package exports is a callback
            return CALLBACK
        if ".demos." in dotted and (name.endswith("Model") or name.startswith("Lightning")):  # BoringModel, ...
            return MODULE_CLASS
        return None
    return lookup(dotted)


def no_lookup(dotted: str) -> None:
    """A lookup for a file checked alone: it knows no other file's classes."""
    return None


class Index:
    """The files checked together, by module name, read when a class's base is one of their classes (or a name they
    import: a package's ``__init__.py``).

    Args:
        modules: each module's file and package.
        parse: a file's syntax tree, ``None`` if it cannot be parsed.

    """

    def __init__(self, modules: Mapping[str, tuple[Path, str]], parse: Callable[[Path], ast.Module | None]) -> None:
        self._modules, self._parse = modules, parse
        self._kinds: dict[str, str | None] = {}
        self._visiting: set[str] = set()

    def kind(self, dotted: str) -> str | None:
        """The kind of the class named ``dotted`` (``package.module.Class``), if one of the files defines it."""
        if dotted in self._kinds:
            return self._kinds[dotted]
        if dotted in self._visiting:  # a cycle of imports
            return None
        self._visiting.add(dotted)
        module, _, name = dotted.rpartition(".")
        found = self._modules.get(module)
        tree = None if found is None else self._parse(found[0])
        kind = None
        if found is not None and tree is not None:
            imports = Imports(tree.body, found[1])
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and node.name == name:
                    kinds = (self._base(module, base, imports) for base in node.bases)
                    kind = next((kind for kind in kinds if kind is not None), None)
            if kind is None and name in imports.names:
                kind = self.kind(imports.names[name])
        self._visiting.discard(dotted)
        self._kinds[dotted] = kind
        return kind

    def _base(self, module: str, base: ast.expr, imports: Imports) -> str | None:
        if isinstance(base, ast.Name) and base.id not in imports.names:  # a class of the same module
            return self.kind(f"{module}.{base.id}")
        return kind_of_base(base, imports, {}, self.kind)
