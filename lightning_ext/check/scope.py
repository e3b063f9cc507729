"""What the names of one function stand for: the module, the trainer, the strategy, a value that differs by rank.

A function's own assignments are read once, in any order (``trainer = self.trainer``, ``rank = self.global_rank``,
``is_zero = self.trainer.is_global_zero``): the check follows no control flow to tell which assignment reaches a use.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from lightning_ext.check.catalogue import COLLECTIVE_NAMES, RANK_ATTRIBUTES, RANK_ENVIRONMENT, RANK_FUNCTIONS
from lightning_ext.check.names import Imports, last_name

__all__ = ["MODULE", "STRATEGY", "TRAINER", "Scope", "own_nodes"]

MODULE, TRAINER, STRATEGY = "module", "trainer", "strategy"
# what an attribute of an object of one role is: `self.trainer` of a module, `trainer.strategy`, ...
_ATTRIBUTES = {
    (MODULE, "trainer"): TRAINER,
    (MODULE, "_trainer"): TRAINER,
    (TRAINER, "strategy"): STRATEGY,
    (TRAINER, "lightning_module"): MODULE,
}
_BY_NAME = {"trainer": TRAINER, "pl_module": MODULE}  # the names Lightning's callback hooks give their arguments
_ENVIRONMENT_GETTERS = ("os.environ.get", "os.getenv")
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclass
class Scope:
    """The names of one function, as the check reads them.

    Attributes:
        imports: the file's imports.
        roles: a name's role (``MODULE``, ``TRAINER``, ``STRATEGY``).
        rank_names: names whose value differs by rank (the function's, the file's top level's).
        rank_attributes: ``self.<name>`` attributes the class sets to a value that differs by rank.
        metric_names: names of torchmetrics objects.
        metric_attributes: ``self.<name>`` attributes the class sets to a torchmetrics object.
        self_name: the name of the method's instance (``self``), if it is a method.
        hook: the Lightning hook the function runs in, if known.

    """

    imports: Imports
    roles: dict[str, str] = field(default_factory=dict)
    rank_names: set[str] = field(default_factory=set)
    rank_attributes: frozenset[str] = frozenset()
    metric_names: set[str] = field(default_factory=set)
    metric_attributes: frozenset[str] = frozenset()
    self_name: str | None = None
    hook: str | None = None

    def inner(
        self,
        function: ast.FunctionDef | ast.AsyncFunctionDef,
        roles: dict[str, str],
        ranks: set[str],
        self_name: str | None,
        hook: str | None,
    ) -> Scope:
        """The scope of ``function`` defined or called here: its parameters bound to ``roles`` (and ``ranks``: those
        given a value that differs by rank), its own assignments read."""
        scope = replace(
            self,
            roles=dict(self.roles),
            rank_names=set(self.rank_names),
            metric_names=set(self.metric_names),
            self_name=self_name,
            hook=hook,
        )
        for parameter in _parameters(function):  # a parameter hides the outer name
            scope.roles.pop(parameter, None)
            scope.rank_names.discard(parameter)
            scope.metric_names.discard(parameter)
        scope.roles.update(roles)
        scope.rank_names.update(ranks)
        scope.read_assignments(function.body)
        return scope

    def read_assignments(self, body: list[ast.stmt], ranks: bool = False) -> None:
        """Learn the roles and metrics of the names that ``body`` assigns (outside nested functions and classes),
        in any order, until nothing changes; with ``ranks``, also the names given a value that differs by rank (at a
        file's top level: in a function, :meth:`assign` follows them in order)."""
        assignments = [
            (node.targets[0] if isinstance(node, ast.Assign) else node.target, node.value)
            for statement in body
            for node in own_nodes(statement)
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and node.value is not None
            and isinstance(node.targets[0] if isinstance(node, ast.Assign) else node.target, ast.Name)
        ]
        changed = True
        while changed:
            changed = False
            for target, value in assignments:
                assert isinstance(target, ast.Name)
                name = target.id
                role = self.role(value)
                if role is not None and self.roles.get(name) != role:
                    self.roles[name] = role
                    changed = True
                if ranks and name not in self.rank_names and self.mentions_rank(value):
                    self.rank_names.add(name)
                    changed = True
                if name not in self.metric_names and self.is_metric(value, constructed=True):
                    self.metric_names.add(name)
                    changed = True

    def assign(self, target: ast.AST, value: ast.AST) -> None:
        """A name assigned here holds a value that differs by rank from now on, or no longer does."""
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            for each, part in zip(target.elts, value.elts, strict=False):
                self.assign(each, part)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for each in target.elts:
                self.assign(each, value)
        elif isinstance(target, ast.Name):
            if self.mentions_rank(value):
                self.rank_names.add(target.id)
            else:
                self.rank_names.discard(target.id)

    def role(self, node: ast.AST) -> str | None:
        """The role of an expression: ``self``, ``trainer``, ``self.trainer.strategy``, an alias of one, ..."""
        if isinstance(node, ast.Name):
            return self.roles.get(node.id, _BY_NAME.get(node.id))
        if isinstance(node, ast.Attribute):
            base = self.role(node.value)
            return None if base is None else _ATTRIBUTES.get((base, node.attr))
        return None

    def is_rank_source(self, node: ast.AST) -> bool:
        """Whether ``node`` itself reads the rank: ``x.global_rank``, ``trainer.is_global_zero``, ``dist.get_rank()``,
        ``os.environ["RANK"]``, ``rank_zero_only.rank``, or a name or ``self`` attribute that holds such a value."""
        if isinstance(node, ast.Attribute):
            if node.attr in RANK_ATTRIBUTES:
                return True
            if node.attr == "rank" and last_name(node.value) == "rank_zero_only":
                return True
            return self.is_self(node.value) and node.attr in self.rank_attributes
        if isinstance(node, ast.Name):
            return node.id in self.rank_names
        if isinstance(node, ast.Call):
            called = self.imports.resolve(node.func)
            if called in RANK_FUNCTIONS:
                return True
            return called in _ENVIRONMENT_GETTERS and bool(node.args) and _rank_variable(node.args[0])
        if isinstance(node, ast.Subscript):
            return self.imports.resolve(node.value) == "os.environ" and _rank_variable(node.slice)
        return False

    def mentions_rank(self, node: ast.AST) -> bool:
        """Whether the value of ``node`` may differ by rank: it reads the rank somewhere, outside a collective call
        (whose result is the same on every rank) and outside a lambda."""
        stack = [node]
        while stack:
            current = stack.pop()
            if self.is_rank_source(current):
                return True
            if isinstance(current, ast.Lambda) or (
                isinstance(current, ast.Call) and last_name(current.func) in COLLECTIVE_NAMES
            ):
                continue
            stack.extend(ast.iter_child_nodes(current))
        return False

    def is_metric(self, node: ast.AST, constructed: bool = False) -> bool:
        """Whether ``node`` is a torchmetrics object (a name or ``self`` attribute known to hold one), or with
        ``constructed``, builds one (``torchmetrics.Accuracy(...)``, ``MeanMetric()`` imported from torchmetrics)."""
        if constructed:
            if not isinstance(node, ast.Call):
                return False
            called = self.imports.resolve(node.func)
            return called is not None and called.split(".")[0] == "torchmetrics"
        if isinstance(node, ast.Name):
            return node.id in self.metric_names
        return isinstance(node, ast.Attribute) and self.is_self(node.value) and node.attr in self.metric_attributes

    def is_self(self, node: ast.AST) -> bool:
        """Whether ``node`` is the method's instance."""
        return isinstance(node, ast.Name) and self.self_name is not None and node.id == self.self_name


def _rank_variable(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in RANK_ENVIRONMENT


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    arguments = function.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    every += [argument for argument in (arguments.vararg, arguments.kwarg) if argument is not None]
    return [argument.arg for argument in every]


def own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and the nodes inside it, but not inside the functions, lambdas and classes it defines."""
    if isinstance(node, _DEFINITIONS):
        yield node
        return
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, _DEFINITIONS):
                stack.append(child)
