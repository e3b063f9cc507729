"""One function's statements in order, with the rank guard each stands under, and the calls it follows one level deep.

A call is guarded inside the branch of an ``if`` (or ``while``, conditional expression, ``and``/``or``) whose test
reads the rank, in that test's ``else``, after a ``return`` under such a test (for the rest of the function), after a
``continue`` or ``break`` under one (for the rest of the loop's body), or in a ``@rank_zero_only`` function.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

from lightning_ext.check.calls import KEYS, Collective, collective
from lightning_ext.check.guards import ELSE, EXIT, IF, LOOP, Guard, rank_zero_only_decorator
from lightning_ext.check.names import last_name
from lightning_ext.check.scope import Scope, own_nodes

__all__ = ["Klass", "Report", "Walker", "instance"]

Function = ast.FunctionDef | ast.AsyncFunctionDef
Report = Callable[[ast.AST, str, str, "Guard | None"], None]  # (node, code, call text, guard)
Escapes = tuple["Guard | None", "Guard | None"]  # (after a guarded return, after a guarded continue/break)


@dataclass
class Klass:
    """A LightningModule or Callback subclass.

    Attributes:
        self_role: the role of its instance (``MODULE``; ``None`` for a callback).
        scope: the names its methods share: the file's top level's, and its ``self`` attributes.
        methods: its methods, its own and those of its bases in the same file.

    """

    self_role: str | None
    scope: Scope
    methods: dict[str, Function] = field(default_factory=dict)


class Walker:
    """Walks one function, reporting each collective call that some ranks make and the others do not.

    Args:
        scope: what the function's names stand for.
        report: called with each finding.
        top: the names of the file's top level.
        functions: the file's top-level functions, followed when called.
        klass: the class whose method this is (its methods are followed when called under a guard).
        follow: whether to follow calls (a followed function follows none: one level deep).

    """

    def __init__(
        self,
        scope: Scope,
        report: Report,
        top: Scope,
        functions: dict[str, Function],
        klass: Klass | None,
        follow: bool,
    ) -> None:
        self.scope, self.report, self.top, self.functions = scope, report, top, functions
        self.klass, self.follow = klass, follow
        self.nested: dict[str, Function] = {}

    def function(self, function: Function, guard: Guard | None) -> None:
        """Walk ``function``'s body, all of it under ``guard`` if one is given (a call under a guard), and each
        function nested in it on its own."""
        guard = guard or rank_zero_only_decorator(function)
        own = {
            node.name: node
            for statement in function.body
            for node in own_nodes(statement)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        self.nested = {**self.nested, **own}
        self.block(function.body, guard)

    def block(self, body: list[ast.stmt], guard: Guard | None) -> Escapes:
        """Walk statements in order; what follows a guarded early exit is guarded by it."""
        returned = looped = None
        for statement in body:
            escapes = self.statement(statement, guard or returned or looped)
            returned, looped = returned or escapes[0], looped or escapes[1]
        return returned, looped

    def statement(self, node: ast.stmt, guard: Guard | None) -> Escapes:
        """Walk one statement under ``guard``; whether it returns, continues or breaks under a rank guard."""
        if isinstance(node, (ast.If, ast.While)):
            self.expression(node.test, guard)
            inside, other = self._branches(node.test, node.lineno, guard)
            escapes = self.block(node.body, inside), self.block(node.orelse, other)
            looped = None if isinstance(node, ast.While) else escapes[0][1] or escapes[1][1]
            return escapes[0][0] or escapes[1][0], looped
        if isinstance(node, (ast.Return, ast.Continue, ast.Break)):
            if isinstance(node, ast.Return) and node.value is not None:
                self.expression(node.value, guard)
            if guard is None:
                return None, None
            return (guard.exit(EXIT), None) if isinstance(node, ast.Return) else (None, guard.exit(LOOP))
        if isinstance(node, (ast.For, ast.AsyncFor)):
            self.expression(node.iter, guard)
            returned = self.block(node.body, guard)[0]
            return returned or self.block(node.orelse, guard)[0], None
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self.expression(item.context_expr, guard)
            return self.block(node.body, guard)
        if isinstance(node, (ast.Try, ast.TryStar)):
            parts = [node.body, *(handler.body for handler in node.handlers), node.orelse, node.finalbody]
            every = [self.block(part, guard) for part in parts]
            return next((e[0] for e in every if e[0]), None), next((e[1] for e in every if e[1]), None)
        if isinstance(node, ast.Match):
            self.expression(node.subject, guard)
            every = [self.block(case.body, guard) for case in node.cases]
            return next((e[0] for e in every if e[0]), None), next((e[1] for e in every if e[1]), None)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if self.follow:  # on its own, with the names known where it is defined
                scope = self.scope.inner(node, {}, set(), self.scope.self_name, self.scope.hook)
                walker = Walker(scope, self.report, self.top, self.functions, self.klass, True)
                walker.nested = self.nested  # it may call the functions beside it
                walker.function(node, None)
            return None, None
        if isinstance(node, ast.ClassDef):
            return None, None  # classes are found wherever they are
        for child in ast.iter_child_nodes(node):
            self.expression(child, guard)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                self.scope.assign(target, node.value)
        return None, None

    def _branches(self, test: ast.expr, line: int, guard: Guard | None) -> tuple[Guard | None, Guard | None]:
        if guard is not None or not self.scope.mentions_rank(test):
            return guard, guard
        return Guard(line, IF), Guard(line, ELSE)

    def expression(self, root: ast.AST, guard: Guard | None) -> None:
        """Report the collectives in an expression; follow its calls."""
        stack: list[tuple[ast.AST, Guard | None]] = [(root, guard)]
        while stack:
            node, current = stack.pop()
            if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.IfExp):
                inside, other = self._branches(node.test, node.lineno, current)
                stack += [(node.test, current), (node.body, inside), (node.orelse, other)]
                continue
            if isinstance(node, ast.BoolOp):  # `a and b`, `a or b`: b runs or not depending on a
                for value in node.values:
                    stack.append((value, current))
                    if current is None and self.scope.mentions_rank(value):
                        current = Guard(value.lineno, IF)
                continue
            found = collective(node, self.scope)
            if found is not None:
                self._found(node, found, current)
            if isinstance(node, ast.Call):
                self._follow(node, current)
            stack.extend((child, current) for child in ast.iter_child_nodes(node))

    def _found(self, node: ast.AST, found: Collective, guard: Guard | None) -> None:
        if found.code == KEYS and guard is not None:  # on some ranks only: that is what the run stops at
            self.report(node, "LX101", found.text, guard)
        elif found.code == KEYS or guard is not None:
            self.report(node, found.code, found.text, guard)

    def _follow(self, call: ast.Call, guard: Guard | None) -> None:
        """Walk the function that ``call`` calls, in this file, under ``call``'s guard: a top-level function always
        (its parameters get the roles of the arguments), a method or a nested function when under a guard (else it
        is walked on its own)."""
        if not self.follow:
            return
        function = call.func
        if isinstance(function, ast.Name) and function.id in self.nested:
            if guard is None:
                return
            callee, klass = self.nested[function.id], self.klass
            roles, ranks = self._bound(call, callee, None)
            scope = self.scope.inner(callee, roles, ranks, self.scope.self_name, self.scope.hook)
        elif isinstance(function, ast.Name) and function.id in self.functions:
            callee, klass = self.functions[function.id], None
            roles, ranks = self._bound(call, callee, None)
            scope = self.top.inner(callee, roles, ranks, None, self.scope.hook)
        elif (
            isinstance(function, ast.Attribute)
            and self.klass is not None
            and self.scope.is_self(function.value)
            and function.attr in self.klass.methods
            and guard is not None
        ):
            callee, klass = self.klass.methods[function.attr], self.klass
            roles, ranks = self._bound(call, callee, self.klass.self_role)
            scope = self.klass.scope.inner(callee, roles, ranks, instance(callee), self.scope.hook)
        else:
            return
        walker = Walker(scope, self.report, self.top, self.functions, klass, False)
        walker.function(callee, None if guard is None else guard.through(call.lineno))

    def _bound(self, call: ast.Call, callee: Function, self_role: str | None) -> tuple[dict[str, str], set[str]]:
        """The roles and the rank-dependent values that ``call``'s arguments give ``callee``'s parameters (a method
        whose instance has ``self_role``: from its second parameter on)."""
        parameters = _parameters(callee)
        roles = {}
        if isinstance(call.func, ast.Attribute) and instance(callee) is not None:  # a method: the instance first
            if self_role is not None:
                roles[parameters[0]] = self_role
            parameters = parameters[1:]
        pairs = [*zip(parameters, call.args, strict=False)]
        pairs += [(keyword.arg, keyword.value) for keyword in call.keywords if keyword.arg is not None]
        ranks = set()
        for parameter, argument in pairs:
            role = self.scope.role(argument)
            if role is not None:
                roles[parameter] = role
            if self.scope.mentions_rank(argument):
                ranks.add(parameter)
        return roles, ranks


def _parameters(function: Function) -> list[str]:
    return [argument.arg for argument in [*function.args.posonlyargs, *function.args.args]]


def instance(method: Function) -> str | None:
    """The name of a method's instance parameter (``self``); ``None`` for a static or class method, or none."""
    if any(last_name(decorator) in ("staticmethod", "classmethod") for decorator in method.decorator_list):
        return None
    parameters = _parameters(method)
    return parameters[0] if parameters else None
