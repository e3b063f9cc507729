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


def test_the_top_level_holds_at_most_fourteen_modules_besides_the_subsystem_folders() -> None:
    # thirteen since issue 39: where the checks' channel binds (_network.py) is imported by _collective.py, so it sits
    # below it with _exchange_rounds.py and _rank_lists.py (the layers' contract), not in a subsystem's folder above it;
    # fourteen since torch.distributed's calls are listed once (_torch_collectives.py) for the hang checks in _watch/
    # and the static check in check/, which imports no subsystem: the list sits at the bottom, below both
    top = [module for module in MODULES if "/" not in module]
    assert len(top) <= 14, top
    assert {"_decisions", "_checks", "_stall", "_preemption", "_per_rank", "strategies", "patches", "demo"} <= _FOLDERS


# A module holds one concern in at most 400 lines. A module listed here holds one concept that needs more room: a
# split would cut it by size, not by concern (as `_checks/uneven_text.py` once was). Its own limit, and why.
LINES = 400
LONGER = {
    "_checks/messages.py": (
        450,
        "every error the hang checks raise, worded by one set of rules (the first line's length, the culprit's call and"
        " line, the ranks grouped, the fix): the uneven-data messages are chosen by the same dispatch",
    ),
}


def test_no_module_is_over_its_line_limit_and_each_module_docstring_is_at_most_five_lines() -> None:
    for module in MODULES:
        text = (PACKAGE / module).read_text(encoding="utf-8")
        limit = LONGER.get(module, (LINES, ""))[0]
        assert text.count("\n") <= limit, (
            f"{module} has {text.count(chr(10))} lines (limit {limit}): split it by concern"
        )
        docstring = ast.get_docstring(ast.parse(text), clean=False)
        assert docstring, f"{module} has no module docstring"
        lines = docstring.strip("\n").split("\n")
        assert len(lines) <= 5, f"{module}'s docstring has {len(lines)} lines: the rest belongs in docs/"


def test_each_longer_module_needs_its_room_and_the_page_states_its_limit() -> None:
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    for module, (limit, _) in LONGER.items():
        lines = (PACKAGE / module).read_text(encoding="utf-8").count("\n")
        assert lines > LINES, f"{module} has {lines} lines: it no longer needs its own limit; drop it from LONGER"
        assert f"`{module}` up to {limit} lines" in page, f"docs/architecture.md does not state {module}'s limit"


BROAD_HANDLERS = 15  # at most, in the whole package (Lightning has 9 in 28,000 lines)
_BROAD = re.compile(r"except Exception\b|suppress\(Exception\)")


def test_broad_exception_handlers_are_few_and_each_says_what_it_guards_and_why_nothing_narrower() -> None:
    """``except Exception`` and ``contextlib.suppress(Exception)``: each one's comment (on its line, or the comment
    lines just above or below it) names what it guards and why nothing narrower will do."""
    found, silent = [], []
    for module in MODULES:
        lines = (PACKAGE / module).read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if not _BROAD.search(line.split("#", 1)[0]):
                continue
            found.append(f"{module}:{number + 1}")
            around = [line.split("#", 1)[1] if "#" in line else ""]
            for step in (-1, 1):
                at = number + step
                while 0 <= at < len(lines) and lines[at].lstrip().startswith("#"):
                    around.append(lines[at].strip().lstrip("#"))
                    at += step
            comment = " ".join(" ".join(around).split()).lower()
            if "guards" not in comment or "nothing narrower" not in comment:
                silent.append(f"{module}:{number + 1}")
    assert len(found) <= BROAD_HANDLERS, f"{len(found)} broad handlers (at most {BROAD_HANDLERS}): {found}"
    assert not silent, f"broad handlers without a comment saying what they guard and why nothing narrower: {silent}"


# ---- the rules the page states ------------------------------------------------------------------------------------
def test_no_import_cycle_even_through_imports_made_for_type_checking() -> None:
    """import-linter leaves out the imports under ``if TYPE_CHECKING:``; a cycle through them is still a cycle."""
    graph = grimp.build_graph("lightning_ext", exclude_type_checking_imports=False)
    cycles = [
        (module, imported)
        for module in sorted(graph.modules)
        for imported in sorted(graph.find_modules_directly_imported_by(module))
        if graph.chain_exists(imported, module)
    ]
    assert not cycles, f"import cycles (a module, one it imports that leads back to it): {cycles}"


def test_the_bottom_layers_vocabulary_imports_nothing_of_lightning_ext() -> None:
    graph = grimp.build_graph("lightning_ext", exclude_type_checking_imports=False)
    for module in ("lightning_ext.policies", "lightning_ext.errors"):
        imported = graph.find_modules_directly_imported_by(module)
        assert not imported, f"{module} imports {sorted(imported)}"


_TALKS_TO_RANKS = {
    "_collective.py": "makes every exchange lightning-ext starts",
    "_watch/facts.py": "counts the collective calls: it wraps torch.distributed's collectives while a run is checked",
    "demo/__main__.py": "a user's program: it ends its process group",
}


def _names_torch_distributed(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.startswith(("torch.distributed", "torch._C._distributed")) for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        from_torch = module == "torch" and any(alias.name == "distributed" for alias in node.names)
        return from_torch or module.startswith(("torch.distributed", "torch._C._distributed"))
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "distributed"
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
    )


def test_only_the_collective_module_and_the_call_counter_use_torch_distributed() -> None:
    users = {
        module
        for module in MODULES
        if any(_names_torch_distributed(node) for node in ast.walk(ast.parse((PACKAGE / module).read_text())))
    }
    assert users == set(_TALKS_TO_RANKS), sorted(users)
    assert _names_torch_distributed(ast.parse("torch.distributed.broadcast(flag, src=0)").body[0].value.func.value)


def _picture_layers() -> list[set[str]]:
    """The layers of the picture in docs/architecture.md, top first: the module names at the start of each row."""
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    picture = page.split("## The layers", 1)[1].split("```", 2)[1]
    layers = []
    for line in picture.splitlines():
        names = []
        for word in line.split():
            if not re.fullmatch(r"\w+(\.py|/)", word):
                break
            names.append(word.removesuffix(".py").removesuffix("/"))
        if names:
            layers.append(set(names))
    return layers


def test_the_pictures_layers_are_the_layers_contract() -> None:
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layered = next(c for c in contracts if c["type"] == "layers" and c["containers"] == ["lightning_ext"])
    assert _picture_layers() == [{name.strip() for name in layer.split("|")} for layer in layered["layers"]]
