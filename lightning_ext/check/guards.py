"""Rank guards: the branch, the early exit or the decorator that lets some ranks, not all, reach a line."""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace

from lightning_ext.check.names import last_name

__all__ = ["DECORATOR", "ELSE", "EXIT", "IF", "LOOP", "Guard", "rank_zero_only_decorator"]

IF, ELSE, EXIT, LOOP, DECORATOR = "if", "else", "exit", "loop", "decorator"


@dataclass(frozen=True)
class Guard:
    """Why a line runs on some ranks only.

    Attributes:
        line: the guard's line: its ``if`` (or ``while``, or conditional expression), or the decorator's.
        how: ``IF`` (inside the guarded branch), ``ELSE`` (its other branch), ``EXIT`` (after an early ``return``
            under it), ``LOOP`` (after a ``continue`` or ``break`` under it, in the loop's body), ``DECORATOR``
            (``@rank_zero_only``).
        via: the line of the call through which the guard reaches another function (``None``: the same function).

    """

    line: int
    how: str
    via: int | None = None

    def exit(self, how: str) -> Guard:
        """The guard of what follows an early exit (``EXIT`` or ``LOOP``) under this guard."""
        return self if self.how in (EXIT, LOOP) else replace(self, how=how)

    def through(self, line: int) -> Guard:
        """This guard, reaching the function called on ``line``."""
        return replace(self, via=line)

    def where(self) -> str:
        """Where the call stands, in words.

        Example:
            >>> Guard(11, ELSE).through(14).where()
            'in the else branch of the rank guard on line 11, through the call on line 14'

        """
        text = {
            IF: f"under the rank guard on line {self.line}",
            ELSE: f"in the else branch of the rank guard on line {self.line}",
            EXIT: f"after the early return under the rank guard on line {self.line}",
            LOOP: f"after the continue or break under the rank guard on line {self.line}",
            DECORATOR: f"in a function decorated with @rank_zero_only on line {self.line}",
        }[self.how]
        return text if self.via is None else f"{text}, through the call on line {self.via}"


def rank_zero_only_decorator(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Guard | None:
    """The guard of a function decorated with ``@rank_zero_only`` (Lightning's, lightning_utilities', ...)."""
    for decorator in function.decorator_list:
        if last_name(decorator) == "rank_zero_only":
            return Guard(decorator.lineno, DECORATOR)
    return None
