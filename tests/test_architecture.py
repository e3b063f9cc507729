"""The layout docs/architecture.md states: every module listed there, a short top level, short modules, no cycles."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lightning_ext"
MODULES = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py"))


def test_every_module_is_listed_in_the_architecture_page() -> None:
    listed = set(re.findall(r"`([\w/]+\.py)`", (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")))
    missing = [module for module in MODULES if module not in listed]
    assert not missing, f"docs/architecture.md does not list {missing}: add each to its subsystem's table"
    gone = sorted(name for name in listed if "/" in name and name not in MODULES and name.split("/")[0] in _FOLDERS)
    assert not gone, f"docs/architecture.md lists modules that do not exist: {gone}"


_FOLDERS = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").is_file()}


def test_the_top_level_holds_at_most_twelve_modules_besides_the_subsystem_folders() -> None:
    top = [module for module in MODULES if "/" not in module]
    assert len(top) <= 12, top
    assert {"_decisions", "_hang", "_per_rank", "strategies", "patches", "demo"} <= _FOLDERS


def test_no_module_is_over_400_lines_and_each_module_docstring_is_at_most_five_lines() -> None:
    for module in MODULES:
        text = (PACKAGE / module).read_text(encoding="utf-8")
        assert text.count("\n") <= 400, f"{module} has {text.count(chr(10))} lines: split it by concern"
        docstring = ast.get_docstring(ast.parse(text), clean=False)
        assert docstring, f"{module} has no module docstring"
        lines = docstring.strip("\n").split("\n")
        assert len(lines) <= 5, f"{module}'s docstring has {len(lines)} lines: the rest belongs in docs/"


def test_the_hang_checks_import_no_cycle_even_through_imports_for_type_checking_only() -> None:
    """import-linter leaves out the imports under ``if TYPE_CHECKING:``; a cycle through them is still a cycle."""
    graph = grimp.build_graph("lightning_ext", exclude_type_checking_imports=False)
    hang = sorted(module for module in graph.modules if module.startswith("lightning_ext._hang."))
    cycles = [
        (module, imported)
        for module in hang
        for imported in sorted(graph.find_modules_directly_imported_by(module))
        if imported.startswith("lightning_ext._hang.") and graph.chain_exists(imported, module)
    ]
    assert not cycles, f"import cycles in lightning_ext._hang (module, one it imports that leads back): {cycles}"
