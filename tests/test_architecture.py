"""The layout docs/architecture.md states: every module listed there, a short top level, short modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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


# ---- the rules the page states ------------------------------------------------------------------------------------
def _import_graph() -> dict[str, set[str]]:
    """Every module of lightning_ext -> the modules of lightning_ext it imports, imports for type checking included."""
    import grimp

    graph = grimp.build_graph("lightning_ext", exclude_type_checking_imports=False)
    return {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}


def _cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            module, successors = work[-1]
            step = next(successors, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    work.append((step, iter(sorted(edges[step]))))
                elif step in stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = set()
                while True:
                    member = stack.pop()
                    component.add(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


# cut by the other half of issue 32 (the _hang/ messages): drop this once that change is in
_BEING_CUT = [{"lightning_ext._hang.lockstep", "lightning_ext._hang.messages"}]


def test_no_import_cycle_even_through_imports_made_for_type_checking() -> None:
    cycles = _cycles(_import_graph())
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]  # the search finds one
    new = [cycle for cycle in cycles if cycle not in _BEING_CUT]
    assert not new, f"import cycles (type-checking imports included): {new}"


def test_the_bottom_layers_vocabulary_imports_nothing_of_lightning_ext() -> None:
    graph = _import_graph()
    for module in ("lightning_ext.policies", "lightning_ext.errors"):
        assert not graph[module], f"{module} imports {sorted(graph[module])}"


_TALKS_TO_RANKS = {
    "_collective.py": "makes every exchange lightning-ext starts",
    "_hang/facts.py": "counts the collective calls: it wraps torch.distributed's collectives while a run is checked",
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
