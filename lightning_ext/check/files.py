"""The files a check reads: each file given, and every ``*.py`` under each folder given, but the usual excludes."""

from __future__ import annotations

import ast
import os
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lightning_ext.check.classes import Index
from lightning_ext.check.findings import Finding
from lightning_ext.check.source import check_tree, may_find

__all__ = ["Checked", "check_paths"]

# the folders a walk skips, as ruff does by default (a folder given by name is read all the same)
EXCLUDED = frozenset(
    {
        "__pycache__",
        "__pypackages__",
        "_build",
        "buck-out",
        "build",
        "dist",
        "node_modules",
        "site-packages",
        "venv",
    }
)


@dataclass
class Checked:
    """What a check of some paths found.

    Attributes:
        findings: every finding, by file, line and column.
        errors: each file that could not be read or parsed, or path that does not exist, with why.
        files: how many files were read.

    """

    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    files: int = 0


def check_paths(paths: Sequence[str | os.PathLike[str]]) -> Checked:
    """Check every Python file of ``paths`` (files, and folders walked for ``*.py``), together: a class whose base is
    a LightningModule or Callback of another of these files is one too.

    Example:
        >>> checked = check_paths(["/no/such/file.py"])
        >>> checked.findings, checked.errors
        ([], ['/no/such/file.py: no such file or folder'])

    """
    checked = Checked()
    packages = _Packages()
    sources: dict[Path, str] = {}
    modules: dict[str, tuple[Path, str]] = {}
    for path in _python_files(paths, checked.errors):
        try:
            with tokenize.open(path) as handle:  # the file's encoding, from its coding comment or BOM
                sources[path] = handle.read()
        except (OSError, SyntaxError, UnicodeDecodeError) as error:
            checked.errors.append(f"{path}: cannot read it: {error}")
            continue
        package = packages.of(path.parent)
        module = package if path.stem == "__init__" else ".".join(filter(None, (package, path.stem)))
        modules.setdefault(module, (path, package))
    trees: dict[Path, ast.Module | None] = {}

    def parse(path: Path) -> ast.Module | None:
        if path not in trees:
            try:
                trees[path] = ast.parse(sources[path], filename=str(path))
            except SyntaxError:
                trees[path] = None
        return trees[path]

    index = Index(modules, parse)
    for path, source in sources.items():
        if not may_find(source):  # no finding without a rank in the text: the file needs no parse
            continue
        try:
            tree = ast.parse(source, filename=str(path)) if trees.get(path) is None else trees[path]
        except SyntaxError as error:
            checked.errors.append(f"{path}:{error.lineno or 0}:{error.offset or 0}: cannot parse it: {error.msg}")
            continue
        assert tree is not None
        checked.findings += check_tree(tree, source, str(path), packages.of(path.parent), index.kind)
    checked.files = len(sources)
    return checked


def _python_files(paths: Sequence[str | os.PathLike[str]], errors: list[str]) -> Iterator[Path]:
    for given in map(Path, paths):
        if given.is_dir():
            for root, folders, files in os.walk(given):
                folders[:] = sorted(name for name in folders if name not in EXCLUDED and not name.startswith("."))
                yield from (Path(root) / name for name in sorted(files) if name.endswith(".py"))
        elif given.is_file():
            yield given
        else:
            errors.append(f"{given}: no such file or folder")


class _Packages:
    """The dotted package of each folder: its name under the folders above it that hold an ``__init__.py``."""

    def __init__(self) -> None:
        self._known: dict[Path, str] = {}

    def of(self, folder: Path) -> str:
        if folder not in self._known:
            if (folder / "__init__.py").is_file() and folder.parent != folder:
                above = self.of(folder.parent)
                self._known[folder] = f"{above}.{folder.name}" if above else folder.name
            else:
                self._known[folder] = ""
        return self._known[folder]
