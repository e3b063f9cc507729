"""What a name means in one file: its imports, so that ``dist.all_reduce`` reads as ``torch.distributed.all_reduce``."""

from __future__ import annotations

import ast
from collections.abc import Iterable

__all__ = ["Imports", "last_name"]


class Imports:
    """The names a file imports, each with the dotted path it stands for.

    Args:
        nodes: the file's import statements (anywhere in it: ``ast.walk``), or its nodes.
        package: the file's package (``a.b`` for ``a/b/c.py``), for relative imports; ``None`` if unknown.

    Example:
        >>> imports = Imports(ast.walk(ast.parse("import torch.distributed as dist\\nfrom os import environ")))
        >>> imports.resolve(ast.parse("dist.all_reduce", mode="eval").body)
        'torch.distributed.all_reduce'
        >>> imports.resolve(ast.parse("environ.get", mode="eval").body)
        'os.environ.get'

    """

    def __init__(self, nodes: Iterable[ast.AST], package: str | None = None) -> None:
        self.names: dict[str, str] = {}
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                    else:  # `import torch.distributed` binds `torch`
                        top = alias.name.split(".")[0]
                        self.names[top] = top
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    parts = (package or "").split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1]) if package else ""
                    module = ".".join(part for part in (base, module) if part)
                for alias in node.names:
                    self.names[alias.asname or alias.name] = f"{module}.{alias.name}" if module else alias.name

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted path of a name or attribute chain whose first name is imported; ``None`` otherwise."""
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None


def last_name(node: ast.AST) -> str | None:
    """The last name of ``a.b.c`` (``c``), of ``c``, or of a call of either; ``None`` for other expressions.

    Example:
        >>> last_name(ast.parse("pl.utilities.rank_zero_only", mode="eval").body)
        'rank_zero_only'

    """
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None
