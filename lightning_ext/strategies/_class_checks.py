"""Whether ``PolicyStrategyMixin`` can work in a class: a ``ParallelStrategy``, the mixin first, a usable vote."""

import inspect

from lightning.pytorch.strategies import ParallelStrategy, Strategy

__all__ = ["check_base", "check_order"]


def check_base(cls: type, mixin: type) -> None:
    """Raise a ``TypeError`` that names the problem if ``mixin`` cannot work in ``cls``.

    ``cls`` must be a ``ParallelStrategy``, with the mixin before every strategy class in its bases, and its
    ``reduce_boolean_decision`` must take Lightning's calls (``(decision)`` and ``(decision, all=False)``) and let the
    policies swap in each rank's own decision (an instance attribute, as :mod:`lightning_ext._decisions.checkpoint`
    does).
    """
    if not issubclass(cls, ParallelStrategy):
        raise TypeError(
            f"{cls.__qualname__} applies PolicyStrategyMixin to a strategy that is not a ParallelStrategy; the policies"
            " decide across ranks, so the mixin needs a parallel strategy such as DDPStrategy, FSDPStrategy,"
            " ModelParallelStrategy or DeepSpeedStrategy"
        )
    check_order(cls, mixin)
    owner = next(base for base in cls.__mro__ if "reduce_boolean_decision" in base.__dict__)
    if owner is ParallelStrategy:
        return
    problem = _incompatible_decision(owner.__dict__["reduce_boolean_decision"])
    if problem is not None:
        raise TypeError(
            f"{owner.__qualname__}.reduce_boolean_decision {problem}; PolicyStrategyMixin needs one that Lightning's"
            " callbacks can call as reduce_boolean_decision(decision) and reduce_boolean_decision(decision, all=False),"
            " a plain method like ParallelStrategy.reduce_boolean_decision(self, decision: bool, all: bool = True)"
        )


def check_order(cls: type, mixin: type) -> None:
    """The mixin must come before the strategy in the bases, or its methods (``__init__`` first) never run."""
    mro = cls.__mro__
    if not issubclass(cls, ParallelStrategy) or mixin not in mro:
        return
    before = mro[: mro.index(mixin)]
    ahead = [base for base in before if issubclass(base, Strategy) and not issubclass(base, mixin)]
    if ahead:
        raise TypeError(
            f"{cls.__qualname__} lists {ahead[0].__qualname__} before PolicyStrategyMixin, so the mixin's methods never"
            f" run; put the mixin first: class {cls.__name__}(PolicyStrategyMixin, {ahead[0].__name__})"
        )


def _incompatible_decision(found: object) -> str | None:
    """What keeps an overriding ``reduce_boolean_decision`` from working with the policies, or ``None``."""
    if isinstance(found, (staticmethod, classmethod)):
        function, leading = found.__func__, () if isinstance(found, staticmethod) else (object,)
    elif inspect.isfunction(found):
        function, leading = found, (object,)
    else:
        return f"is a {type(found).__name__}, not a method"
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return "has no signature that can be read"
    try:
        signature.bind(*leading, True)
        signature.bind(*leading, True, all=False)
    except TypeError:
        return f"has the signature {signature}"
    return None
