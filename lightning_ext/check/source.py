"""One file's check: its LightningModule and Callback subclasses, each method walked, the findings not silenced."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from lightning_ext.check.calls import KEYS
from lightning_ext.check.catalogue import RANK_WORDS
from lightning_ext.check.classes import MODULE_CLASS, Lookup, kind_of_base, no_lookup
from lightning_ext.check.codes import message
from lightning_ext.check.findings import Finding, silenced
from lightning_ext.check.guards import Guard
from lightning_ext.check.names import Imports
from lightning_ext.check.scope import MODULE, TRAINER, Scope, own_nodes
from lightning_ext.check.walk import Function, Klass, Walker, instance

__all__ = ["check_source", "check_tree", "may_find"]


def check_source(
    source: str, path: str = "<string>", package: str | None = None, lookup: Lookup = no_lookup
) -> list[Finding]:
    """The findings in one file's source, in order, without those its ``# noqa`` comments silence.

    Args:
        source: the file's text.
        path: the file's name in the findings.
        package: the file's package, for its relative imports.
        lookup: the kind of a class of another file, by dotted name (:meth:`Index.kind`), for the bases it imports.

    Raises:
        SyntaxError: the source is not Python.

    Example:
        >>> source = '''
        ... import lightning as L
        ... class Model(L.LightningModule):
        ...     def on_train_epoch_end(self):
        ...         if self.trainer.is_global_zero:
        ...             self.trainer.save_checkpoint("last.ckpt")
        ... '''
        >>> [(finding.line, finding.code, finding.guard_line) for finding in check_source(source)]
        [(6, 'LX202', 5)]

    """
    return check_tree(ast.parse(source, filename=path), source, path, package, lookup)


def may_find(source: str) -> bool:
    """Whether a file's text may hold a finding: every finding reads the rank somewhere in the file."""
    return any(word in source for word in RANK_WORDS)


def check_tree(tree: ast.Module, source: str, path: str, package: str | None, lookup: Lookup) -> list[Finding]:
    """:func:`check_source` of a file already parsed."""
    nodes = list(ast.walk(tree))
    imports = Imports((node for node in nodes if isinstance(node, (ast.Import, ast.ImportFrom))), package)
    top = Scope(imports)
    top.read_assignments(tree.body, ranks=True)
    functions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found: dict[tuple[int, int, str], Finding] = {}

    def report(node: ast.AST, code: str, call: str, guard: Guard | None) -> None:
        line, column = node.lineno, node.col_offset + 1  # type: ignore[attr-defined]
        slot = (line, column, "LX101" if code == KEYS else code)  # a guarded call with rank keys: the guard's finding
        if slot in found and not (found[slot].code == KEYS and code != KEYS):
            return
        where = guard.where() if guard is not None else "with a key that depends on the rank"
        end = (node.end_lineno or line, (node.end_col_offset or 0) + 1)  # type: ignore[attr-defined]
        found[slot] = Finding(
            path, line, column, *end, code, message(code, call, where), None if guard is None else guard.line
        )

    classes = sorted((node for node in nodes if isinstance(node, ast.ClassDef)), key=lambda node: node.lineno)
    for klass, node in _lightning_classes(classes, imports, top, lookup):
        for method in node.body:
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope = klass.scope.inner(method, _roles(klass, method), set(), instance(method), method.name)
                Walker(scope, report, top, functions, klass, True).function(method, None)
    return silenced(source, sorted(found.values()))


def _lightning_classes(
    nodes: list[ast.ClassDef], imports: Imports, top: Scope, lookup: Lookup
) -> list[tuple[Klass, ast.ClassDef]]:
    """The LightningModule and Callback subclasses among a file's classes (nested in functions too), bases first."""
    kinds: dict[str, str] = {}
    classes: dict[str, Klass] = {}
    found = []
    for node in nodes:
        bases = [kind_of_base(base, imports, kinds, lookup) for base in node.bases]
        kind = next((kind for kind in bases if kind is not None), None)
        if kind is None:
            continue
        kinds[node.name] = kind
        methods: dict[str, Function] = {}
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                methods.update(classes[base.id].methods)
        methods.update(
            (method.name, method) for method in node.body if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))
        )
        self_role = MODULE if kind == MODULE_CLASS else None
        klass = classes[node.name] = Klass(self_role, _class_scope(top, methods.values(), self_role), methods)
        found.append((klass, node))
    return found


def _class_scope(top: Scope, methods: Iterable[Function], self_role: str | None) -> Scope:
    """The names a class's methods share: the file's, and the ``self`` attributes it sets to a value that differs
    by rank or to a torchmetrics object."""
    ranks, metrics = set(), set()
    for method in methods:
        name = instance(method)
        if name is None:
            continue
        scope = top.inner(method, {name: self_role} if self_role else {}, set(), name, None)
        scope.read_assignments(method.body, ranks=True)  # `rank = self.global_rank` then `self.zero = rank == 0`
        for node in (n for statement in method.body for n in own_nodes(statement)):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Attribute) and scope.is_self(target.value):
                    if scope.mentions_rank(node.value):
                        ranks.add(target.attr)
                    if scope.is_metric(node.value, constructed=True):
                        metrics.add(target.attr)
    return Scope(
        top.imports,
        dict(top.roles),
        set(top.rank_names),
        frozenset(ranks),
        set(top.metric_names),
        frozenset(metrics),
    )


def _roles(klass: Klass, method: Function) -> dict[str, str]:
    """The roles of a method's parameters: its instance; a callback hook's ``trainer`` and ``pl_module``."""
    parameters = [argument.arg for argument in [*method.args.posonlyargs, *method.args.args]]
    self_name = instance(method)
    roles = {}
    if klass.self_role is not None and self_name is not None:
        roles[self_name] = klass.self_role
    hook = self_name is not None and method.name.startswith(("on_", "setup", "teardown"))
    if klass.self_role is None and hook and len(parameters) >= 3:
        roles[parameters[1]], roles[parameters[2]] = TRAINER, MODULE
    return roles
