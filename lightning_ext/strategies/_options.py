"""The strategies' options, defined once; every strategy's signature is built from them and its base's.

An option is a field of :class:`StrategyOptions`. :func:`init_for` gives a strategy class an ``__init__`` whose
signature is its Lightning base's parameters (read from the base), then the options, then ``**kwargs`` if the base has.
"""

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, cast

from lightning_ext._checks.guard import HangChecks, UnevenMode
from lightning_ext._per_rank.writer import PerRankMetrics
from lightning_ext._stall.monitor import OnStall
from lightning_ext._sync.hooks import LogSync
from lightning_ext.policies import DecisionPolicy, PolicyLike

__all__ = ["StrategyOptions", "give_init", "init_for", "mixin_signature"]


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """The mixin's keyword-only options and their defaults, as the user gave them (described in
    :class:`~lightning_ext.PolicyStrategyMixin` and ``docs/strategies.md``)."""

    checkpoint_policy: PolicyLike = "all"
    early_stopping_policy: PolicyLike = "any"
    per_rank_metrics: bool | PerRankMetrics = False
    hang_checks: HangChecks = True
    uneven_batches: UnevenMode = "error"
    check_unsized_loaders: bool = False
    check_channel_timeout: float = 30.0
    decision_record: bool = True
    preemption_policy: PolicyLike | None = "any"
    stall_timeout: float | str | None = "auto"
    on_stall: OnStall = "error"
    log_sync: LogSync = "coalesced"

    @classmethod
    def take(cls, kwargs: dict[str, Any]) -> "StrategyOptions":
        """The options among ``kwargs``, removed from it (the rest is the strategy's)."""
        return cls(**{name: kwargs.pop(name) for name in _NAMES if name in kwargs})

    def described(self) -> dict[str, tuple[str, str]]:
        """Each option by name, as the ranks compare it at set-up and as people read it: ``(identity, text)``; a
        policy's identity is its ``describe()`` (the stable text :class:`~lightning_ext.DecisionPolicy` defines for
        this), its text its ``repr``; any other value is its ``repr`` for both.

        Example:
            >>> StrategyOptions(log_sync="per_value").described()["log_sync"]
            ("'per_value'", "'per_value'")

        """
        return {
            name: (value.describe() if isinstance(value, DecisionPolicy) else repr(value), repr(value))
            for name, value in ((name, getattr(self, name)) for name in _NAMES)
        }


_NAMES = tuple(field.name for field in dataclasses.fields(StrategyOptions))


def _option_parameters() -> list[inspect.Parameter]:
    hints = typing.get_type_hints(StrategyOptions)
    return [
        inspect.Parameter(
            field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default, annotation=hints[field.name]
        )
        for field in dataclasses.fields(StrategyOptions)
    ]


def mixin_signature(init: Callable[..., None]) -> inspect.Signature:
    """``(self, *args, <the options>, **kwargs)``: the mixin's ``__init__``, which passes the rest to the strategy."""
    first = list(inspect.signature(init).parameters.values())[:1]
    args = inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL, annotation=Any)
    kwargs = inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD, annotation=Any)
    return inspect.Signature([*first, args, *_option_parameters(), kwargs], return_annotation=None)


def init_for(cls: type, base: type) -> Callable[..., None] | None:
    """An ``__init__`` for ``cls`` that calls the next one in its MRO (the mixin's), with the signature of ``base``'s
    ``__init__`` and the options; ``None`` if ``base``'s signature cannot be read."""
    base_init = base.__dict__["__init__"]
    try:
        theirs = inspect.signature(base_init)
    except (TypeError, ValueError):
        return None
    parameters = list(theirs.parameters.values())
    var_keyword = [p for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
    own = [p for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
    clash = [p.name for p in own if p.name in _NAMES]
    if clash:  # the option would hide the strategy's own argument
        raise TypeError(
            f"{cls.__qualname__}: {base.__qualname__}.__init__ has a parameter named {clash[0]!r}, which is also an"
            " option of PolicyStrategyMixin; rename it in your strategy"
        )
    options = _option_parameters()
    template = _calling_super(cls)
    # The base's annotations are resolved where they were written (its module's names, TYPE_CHECKING ones included,
    # as jsonargparse resolves them for the base itself): the function shares the base's globals and module.
    init: Any = types.FunctionType(
        template.__code__, getattr(base_init, "__globals__", {}), "__init__", None, template.__closure__
    )
    init.__signature__ = theirs.replace(parameters=[*own, *options, *var_keyword], return_annotation=None)
    init.__annotations__ = {**getattr(base_init, "__annotations__", {}), **{p.name: p.annotation for p in options}}
    init.__module__ = getattr(base_init, "__module__", cls.__module__)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = f"Every argument of {base.__qualname__}, then the options of PolicyStrategyMixin."
    return cast(Callable[..., None], init)


def _calling_super(klass: type) -> Callable[..., None]:
    """``__init__(self, *args, **kwargs)`` calling ``super().__init__`` for ``klass``: the plain ``super()`` that
    jsonargparse follows to find what ``**kwargs`` takes (it needs the ``__class__`` cell set here)."""
    __class__ = klass  # noqa: F841 (the cell that super() reads)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[misc]

    return __init__


def give_init(cls: type, mixin: type) -> None:
    """Give ``cls``, a subclass of ``mixin`` that defines no ``__init__`` (nor does any class between it and the
    mixin), one with its strategy's signature and the options (:func:`init_for`)."""
    mro = cls.__mro__
    if mixin not in mro:
        return
    at = mro.index(mixin)
    if any("__init__" in vars(klass) for klass in mro[:at]):
        return
    base = next((klass for klass in mro[at + 1 :] if "__init__" in vars(klass) and klass is not object), None)
    init = None if base is None else init_for(cls, base)
    if init is not None:
        cls.__init__ = init  # type: ignore[misc]
