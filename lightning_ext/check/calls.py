"""Which calls are collective: a synced ``self.log``, ``trainer.log_dir``, ``strategy.barrier()``, ``dist.all_reduce``
(as each stands in a file: its imports, the roles of its names)."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from lightning_ext.check.catalogue import (
    LOG_METHODS,
    NO_LOGGING_HOOKS,
    STEP_HOOKS,
    STRATEGY_CODES,
    TORCH_COLLECTIVES,
    TORCH_DISTRIBUTED,
)
from lightning_ext.check.scope import MODULE, STRATEGY, TRAINER, Scope

__all__ = ["KEYS", "Collective", "collective"]

KEYS = "LX103"  # the one kind that is a finding without a guard: the keys themselves differ by rank
_SHORT = 60  # characters of a receiver shown in a message


@dataclass(frozen=True)
class Collective:
    """A collective call (or property) found in the source.

    Attributes:
        code: the kind of finding it is, where it runs on some ranks only (``KEYS``: wherever it runs).
        text: how the message names it, e.g. ``self.log('val_acc', sync_dist=True)``.

    """

    code: str
    text: str


def collective(node: ast.AST, scope: Scope) -> Collective | None:
    """The collective that ``node`` (a call, or an attribute read) is, if it is one."""
    if isinstance(node, ast.Attribute):
        if node.attr == "log_dir" and isinstance(node.ctx, ast.Load) and scope.role(node.value) == TRAINER:
            return Collective("LX201", f"{_text(node.value)}.log_dir")
        return None
    if not isinstance(node, ast.Call):
        return None
    function = node.func
    called = scope.imports.resolve(function)
    if called is not None and called.rpartition(".")[0] == TORCH_DISTRIBUTED:
        name = called.rpartition(".")[2]
        return Collective("LX205", f"{_text(function)}{_arguments(node)}") if name in TORCH_COLLECTIVES else None
    if not isinstance(function, ast.Attribute):
        return None
    role = scope.role(function.value)
    if role == MODULE and function.attr in LOG_METHODS:
        return _logged(node, function, scope)
    code = {
        (MODULE, "all_gather"): "LX204",
        (TRAINER, "save_checkpoint"): "LX202",
        **{(STRATEGY, name): code for name, code in STRATEGY_CODES.items()},
    }.get((role or "", function.attr))
    return None if code is None else Collective(code, f"{_text(function)}{_arguments(node)}")


def _logged(node: ast.Call, function: ast.Attribute, scope: Scope) -> Collective | None:
    """A ``self.log`` / ``self.log_dict`` that syncs: with ``sync_dist=True`` (and not ``rank_zero_only=True``), or of
    a torchmetrics object computed at the epoch's end."""
    if scope.hook in NO_LOGGING_HOOKS:  # Lightning raises there, on every rank that logs: no rank waits
        return None
    keywords = {keyword.arg: keyword.value for keyword in node.keywords}
    dictionary = function.attr == "log_dict"
    value = _argument(node, keywords, 0 if dictionary else 1, "dictionary" if dictionary else "value")
    name = None if dictionary else _argument(node, keywords, 0, "name")
    shown = "{...}" if dictionary else repr(name.value) if isinstance(name, ast.Constant) else "..."
    if value is not None and scope.is_metric(value):
        on_epoch = keywords.get("on_epoch")
        if on_epoch is None:
            computed = scope.hook not in STEP_HOOKS
        else:
            computed = isinstance(on_epoch, ast.Constant) and on_epoch.value is True
        return Collective("LX102", f"{_text(function)}({shown}, <metric>)") if computed else None
    if not (_true(keywords.get("sync_dist")) and not _true(keywords.get("rank_zero_only"))):
        return None
    text = f"{_text(function)}({shown}, sync_dist=True)"
    keys: list[ast.expr | None] = [name]
    if isinstance(value, ast.Dict):
        keys = list(value.keys)
    elif isinstance(value, ast.DictComp):
        keys = [value.key]
    if any(key is not None and scope.mentions_rank(key) for key in keys):
        return Collective(KEYS, text)
    return Collective("LX101", text)


def _argument(node: ast.Call, keywords: dict[str | None, ast.expr], position: int, name: str) -> ast.expr | None:
    if len(node.args) > position and not any(isinstance(argument, ast.Starred) for argument in node.args):
        return node.args[position]
    return keywords.get(name)


def _true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _arguments(node: ast.Call) -> str:
    return "(...)" if node.args or node.keywords else "()"


def _text(node: ast.expr) -> str:
    text = ast.unparse(node)
    return text if len(text) <= _SHORT else f"...{text[-_SHORT:]}"
